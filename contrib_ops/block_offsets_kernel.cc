// AddBlockOffsets kernels (see block_offsets.h), compiled once per ISA like the attention kernel.
// Both are written as fixed-width lane loops that the compiler turns into vector code for the ISA
// of the build (no reassociation needed: each lane is its own sum).
#include "block_offsets_kernel.h"

#include "kernel_build.h"

namespace ortserve {
namespace ORTSERVE_ISA {

namespace {

#include "simd_math.h"  // HalvesToFloats: in this ISA's namespace

constexpr int64_t kLanes = 8;         // partial sums per block: one vector of the narrowest ISA
constexpr int64_t kStreamedRows = 4;  // up to this many rows, offsets stream in memory order

// Eight vectors of accumulators (AVX-512: 128 columns, AVX2: 64): enough independent FMA chains to
// hide the FMA latency, few enough to stay in registers.
#if defined(__AVX512F__)
constexpr int64_t kWide = 128;
#else
constexpr int64_t kWide = 64;
#endif

// Columns [n, ...) of one row in chunks of W held in registers while the blocks stream past: out
// starts from y and is written once. Returns the first column not done.
template <int64_t W>
int64_t RowChunks(const float* y_row, const float* s, const float* offsets, float* out_row, int64_t nb, int64_t N,
                  int64_t n, int64_t n1) {
  for (; n + W <= n1; n += W) {
    float acc[W];
    for (int64_t j = 0; j < W; ++j) acc[j] = y_row[n + j];
    for (int64_t b = 0; b < nb; ++b) {
      const float weight = s[b];
      const float* row = offsets + b * N + n;
      for (int64_t j = 0; j < W; ++j) acc[j] += weight * row[j];
    }
    for (int64_t j = 0; j < W; ++j) out_row[n + j] = acc[j];
  }
  return n;
}

}  // namespace

void BlockSums(const float* x, float* sums, int64_t T, int64_t K, int64_t block_size) {
  const int64_t nb = K / block_size, wide = block_size - block_size % kLanes;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const float* in = x + t * K + b * block_size;
      float lane[kLanes] = {};
      for (int64_t i = 0; i < wide; i += kLanes)
        for (int64_t j = 0; j < kLanes; ++j) lane[j] += in[i + j];
      float s = 0.f;
      for (int64_t j = 0; j < kLanes; ++j) s += lane[j];
      for (int64_t i = wide; i < block_size; ++i) s += in[i];
      sums[t * nb + b] = s;
    }
}

// A few rows (decode): offsets are read once in memory order, row by row, onto out, which stays in
// cache. More rows (a prefill chunk): each row's chunk of columns is held in registers while the
// blocks stream past, so the range's slice of offsets ([nb, n1 - n0], a few KB) is read from cache
// for every row and out is written once.
void AddOffsetColumns(const float* y, const float* sums, const float* offsets, float* out, int64_t T, int64_t nb,
                      int64_t N, int64_t n0, int64_t n1) {
  if (T <= kStreamedRows) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = n0; n < n1; ++n) out[t * N + n] = y[t * N + n];
    for (int64_t b = 0; b < nb; ++b) {
      const float* row = offsets + b * N;
      for (int64_t t = 0; t < T; ++t) {
        const float weight = sums[t * nb + b];
        float* out_row = out + t * N;
        for (int64_t n = n0; n < n1; ++n) out_row[n] += weight * row[n];
      }
    }
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    const float *s = sums + t * nb, *y_row = y + t * N;
    float* out_row = out + t * N;
    int64_t n = RowChunks<kWide>(y_row, s, offsets, out_row, nb, N, n0, n1);
    n = RowChunks<16>(y_row, s, offsets, out_row, nb, N, n, n1);
    RowChunks<1>(y_row, s, offsets, out_row, nb, N, n, n1);
  }
}

// Decode with fp16 offsets: as the few-rows path above, each offsets row converted in chunks of
// kHalfChunk floats on the way in (half the bytes read: the reason to store them as fp16).
void AddHalfOffsetColumns(const float* y, const float* sums, const uint16_t* offsets, float* out, int64_t T,
                          int64_t nb, int64_t N, int64_t n0, int64_t n1) {
  constexpr int64_t kHalfChunk = 64;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = n0; n < n1; ++n) out[t * N + n] = y[t * N + n];
  float row[kHalfChunk];
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t n = n0; n < n1; n += kHalfChunk) {
      const int64_t width = n1 - n < kHalfChunk ? n1 - n : kHalfChunk;
      HalvesToFloats(offsets + b * N + n, row, width);
      for (int64_t t = 0; t < T; ++t) {
        const float weight = sums[t * nb + b];
        float* out_row = out + t * N + n;
        for (int64_t j = 0; j < width; ++j) out_row[j] += weight * row[j];
      }
    }
}

void HalfRowsToFloats(const uint16_t* halves, float* out, int64_t n) { HalvesToFloats(halves, out, n); }

}  // namespace ORTSERVE_ISA
}  // namespace ortserve
