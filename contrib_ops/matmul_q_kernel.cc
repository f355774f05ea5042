// MatMulQ kernels (see matmul_q_kernel.h), compiled once per ISA. Per block of 32 columns and
// group of 16 weight rows, the integer dot products of the 4-, 5- or 8-bit codes (Q4NL: 8-bit codes
// looked up from 4-bit indices with vpshufb, then as 8-bit codes; Q4K and Q5K: 4- and 5-bit codes whose
// d and m are their super-block's d and -dmin times the block's u8 sub-scales and mins) with the int8 activations
// run with one int32 lane per weight row (AVX-512 VNNI: vpdpbusd; AVX2: vpmaddubsw + vpmaddwd on 4-bit
// halves, so the int16 sums cannot saturate), then
//   acc[row] += dot * (d[row] * dx) + m[row] * (dx * sum(xq))     // w = d * q + m, x ~ dx * xq
// in float. Lanes are weight rows, so no horizontal sums: a group's 16 outputs are one vector.
// Up to kTileRows activation rows share each unpacked block of codes (prefill chunks, batched decode).
// With 16-bit activations each row of x is two int8 rows, its codes and the residual's, whose
// results are added as they are stored.
// This file holds what the ISAs share (quantising x, the tiles over rows and groups); each ISA's group
// kernel is in matmul_q_group_<isa>.h.
#include "matmul_q_kernel.h"

#include "kernel_build.h"

#if defined(__AVX2__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized reports
// wherever they are inlined: a false positive of the compiler's own headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace ortserve {
namespace ORTSERVE_ISA {

namespace {

#include "simd_math.h"  // HalfToFloat, HalvesToFloats: in this ISA's namespace

ALWAYS_INLINE int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }

// The scale vectors a block (or super-block) of a centred layout (d) or another (d, m) has.
template <int Bits>
constexpr int64_t kScaleVectors = kQCentredOf<Bits> ? 1 : 2;

// A group's scales: a (d, m) pair of vectors a block (centred: d alone), MatMulQ3K's and Q6K's one d vector for
// kQSuperBlocks blocks, MatMulQ4K's, Q5K's and Q2K's (d, -dmin) pair of vectors for kQSuperBlocks blocks, or
// MatMulQ4XS's d.
template <int Bits>
constexpr int64_t GroupScales(int64_t KB) {
  const int64_t super_blocks = (KB + kQSuperBlocks - 1) / kQSuperBlocks;
  return kQSub16Of<Bits>             ? super_blocks * (kQSub16MinsOf<Bits> ? 2 : 1) * kQGroup
         : kQSuperBlockDMOf<Bits>    ? super_blocks * kScaleVectors<Bits> * kQGroup
                                     : KB * kScaleVectors<Bits> * kQGroup;
}

// Where block b's (d, m) vectors (centred: d) start, or (MatMulQ4K / Q5K) its super-block's (d, -dmin).
template <int Bits, typename S>
ALWAYS_INLINE const S* BlockScalesAt(const S* scales, int64_t b) {
  return scales + (kQSuperBlockDMOf<Bits> ? b / kQSuperBlocks : b) * kScaleVectors<Bits> * kQGroup;
}

ALWAYS_INLINE float CodeStep(float amax) { return amax / 127.f; }  // dx: one int8 code's worth of x

ALWAYS_INLINE float Inverse(float amax) { return amax > 0.f ? 127.f / amax : 0.f; }

// A block of up to 32 values of x, zero-padded to 32.
ALWAYS_INLINE const float* Block32(const float* x, int64_t n, float* pad) {
  if (n == kQBlock) return x;
  for (int64_t i = 0; i < kQBlock; ++i) pad[i] = i < n ? x[i] : 0.f;
  return pad;
}

ALWAYS_INLINE int32_t Load32(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

#if defined(__AVX2__)
// Decode reads every weight once per call, group after group, and the hardware prefetchers alone
// keep too few lines in flight for one core's stream (SmolLM2-135M int4 decode read its weights at
// about 13 GB/s of the 28-30 GB/s two cores can). So the tile loops ask for the codes and scales
// kPrefetchBytes of codes ahead: past the group's end that is the next group's, which follows it.
// (1, 2, 4 and 8 KiB ahead: 4 KiB was best, benchmarks/tables/matmul_prefetch.md.)
constexpr int64_t kPrefetchBytes = 4096;

template <int Bits, typename S>
ALWAYS_INLINE void PrefetchAhead(const uint8_t* block_codes, const S* block_scales) {
  const char* codes = reinterpret_cast<const char*>(block_codes + kPrefetchBytes);
  for (int64_t line = 0; line < kQBlockBytesOf<Bits>; line += 64) _mm_prefetch(codes + line, _MM_HINT_T0);
  if constexpr (kQSub16Of<Bits> || kQSuperBlockDMOf<Bits>) return;  // a super-block's d: the rest is in the codes
  constexpr int64_t kScales = kScaleVectors<Bits> * kQGroup;  // a block's
  const char* scales = reinterpret_cast<const char*>(block_scales + kPrefetchBytes / kQBlockBytesOf<Bits> * kScales);
  for (int64_t line = 0; line < static_cast<int64_t>(kScales * sizeof(S)); line += 64) _mm_prefetch(scales + line, _MM_HINT_T0);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include "matmul_q_group_avx512.h"
#elif defined(__AVX2__)
#include "matmul_q_group_avx2.h"
#else
#include "matmul_q_group_generic.h"
#endif
#include "matmul_q_sub16_group.h"

template <int Bits, typename S, int MT, bool Pairs>
void TileRows(const uint8_t* codes, const S* scales, const int8_t* xq, const float* xs, const float* hs,
              const float* bias, float* y, int64_t KB, int64_t N, int64_t t, int64_t g0, int64_t g1) {
  const int64_t xq_stride = KB * kQBlock, xs_stride = 2 * KB;
  float* y_rows = y + (Pairs ? t / 2 : t) * N;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t n0 = g * kQGroup;
    const uint8_t* group_codes = codes + g * KB * kQBlockBytesOf<Bits>;
    const S* group_scales = scales + g * GroupScales<Bits>(KB);
    const int64_t valid = MinI(kQGroup, N - n0);
    if constexpr (kQSub16Of<Bits>)
      GroupRowsSub16<Bits, S, MT, Pairs>(group_codes, group_scales, xq + t * xq_stride, xq_stride, xs + t * xs_stride,
                                         hs ? hs + t * xs_stride : nullptr, xs_stride, bias ? bias + n0 : nullptr,
                                         y_rows + n0, N, KB, valid);
    else
      GroupRows<Bits, S, MT, Pairs>(group_codes, group_scales, xq + t * xq_stride, xq_stride, xs + t * xs_stride,
                                    xs_stride, bias ? bias + n0 : nullptr, y_rows + n0, N, KB, valid);
  }
}

// The last rows < kTileRows of a range, in one pass over the weights (Pairs: an even count).
template <int Bits, typename S, int MT, bool Pairs>
void LastRows(const uint8_t* codes, const S* scales, const int8_t* xq, const float* xs, const float* hs,
              const float* bias, float* y, int64_t KB, int64_t N, int64_t t, int64_t rows, int64_t g0, int64_t g1) {
  constexpr int kStep = Pairs ? 2 : 1;
  if constexpr (MT > kStep) {
    if (rows < MT)
      return LastRows<Bits, S, MT - kStep, Pairs>(codes, scales, xq, xs, hs, bias, y, KB, N, t, rows, g0, g1);
  }
  if constexpr (MT >= 1) TileRows<Bits, S, MT, Pairs>(codes, scales, xq, xs, hs, bias, y, KB, N, t, g0, g1);
}

template <int Bits, typename S, bool Pairs>
void Tile(const uint8_t* codes, const S* scales, const int8_t* xq, const float* xs, const float* hs, const float* bias,
          float* y, int64_t KB, int64_t N, int64_t t0, int64_t t1, int64_t g0, int64_t g1) {
  constexpr int kLast = kTileRows - (Pairs ? 2 : 1);  // the most rows a last tile can have
  if (kRowsOuter && t1 - t0 > 2 * kTileRows) {  // a prefill task: its codes come from L2, not memory
    int64_t t = t0;
    for (; t + kTileRows <= t1; t += kTileRows)  // each tile of rows stays in L1 while its groups pass
      TileRows<Bits, S, kTileRows, Pairs>(codes, scales, xq, xs, hs, bias, y, KB, N, t, g0, g1);
    if (t < t1) LastRows<Bits, S, kLast, Pairs>(codes, scales, xq, xs, hs, bias, y, KB, N, t, t1 - t, g0, g1);
    return;
  }
  for (int64_t g = g0; g < g1; ++g) {  // a group's codes stay in L1 while every tile of rows passes
    int64_t t = t0;
    if constexpr (Pairs && kWidenedMaxBlocks > 0 && !kQSub16Of<Bits>) {  // AVX2: whole tiles of pairs, each block widened once
      const int64_t xq_stride = KB * kQBlock, xs_stride = 2 * KB, n0 = g * kQGroup;
      const int64_t whole_end = t0 + (t1 - t0) / kTileRows * kTileRows;
      while (KB <= kWidenedMaxBlocks && t1 - t0 >= 2 * kTileRows && t < whole_end) {
        const int64_t rows = MinI(2 * kWidenedMaxPairs, whole_end - t);
        GroupPairsWidenedOnce<Bits, S>(codes + g * KB * kQBlockBytesOf<Bits>, scales + g * GroupScales<Bits>(KB),
                                       xq + t * xq_stride, xq_stride, xs + t * xs_stride, xs_stride,
                                       bias ? bias + n0 : nullptr, y + t / 2 * N + n0, N, KB, MinI(kQGroup, N - n0),
                                       rows / 2);
        t += rows;
      }
    }
    for (; t + kTileRows <= t1; t += kTileRows)
      TileRows<Bits, S, kTileRows, Pairs>(codes, scales, xq, xs, hs, bias, y, KB, N, t, g, g + 1);
    if (t < t1) LastRows<Bits, S, kLast, Pairs>(codes, scales, xq, xs, hs, bias, y, KB, N, t, t1 - t, g, g + 1);
  }
}

template <int Bits, typename S>
void TileOf(const uint8_t* codes, const S* scales, bool pairs, const int8_t* xq, const float* xs, const float* hs,
            const float* bias, float* y, int64_t KB, int64_t N, int64_t t0, int64_t t1, int64_t g0, int64_t g1) {
  if (pairs)
    Tile<Bits, S, true>(codes, scales, xq, xs, hs, bias, y, KB, N, t0, t1, g0, g1);
  else
    Tile<Bits, S, false>(codes, scales, xq, xs, hs, bias, y, KB, N, t0, t1, g0, g1);
}

template <int Bits>
void TileOfBits(const uint8_t* codes, const void* scales, bool half, bool pairs, const int8_t* xq, const float* xs,
                const float* hs, const float* bias, float* y, int64_t KB, int64_t N, int64_t t0, int64_t t1,
                int64_t g0, int64_t g1) {
  if (half)
    TileOf<Bits>(codes, static_cast<const uint16_t*>(scales), pairs, xq, xs, hs, bias, y, KB, N, t0, t1, g0, g1);
  else
    TileOf<Bits>(codes, static_cast<const float*>(scales), pairs, xq, xs, hs, bias, y, KB, N, t0, t1, g0, g1);
}

// A row of x to int8 blocks and, with a residual, the part of each block the codes miss (see the
// header and QuantizePairAt); halves, if any, MatMulQ2K's.
void QuantizeRow(const float* x, int64_t K, int64_t KB, bool residual, int8_t* xq, float* xs, float* halves) {
  float pad[kQBlock];
  for (int64_t b = 0; b < KB; ++b) {
    const int64_t k0 = b * kQBlock;
    const float* in = Block32(x + k0, MinI(kQBlock, K - k0), pad);
    const float amax = BlockAmax(in), inverse = Inverse(amax);
    int32_t sums[4];  // the halves' code sums (QuantizeAt), then the residual's
    if (residual) {
      QuantizePairAt(in, inverse, CodeStep(amax), xq, KB, b, sums);
    } else {
      QuantizeAt(in, inverse, xq + k0, sums);
    }
    for (int64_t row = 0; row < (residual ? 2 : 1); ++row) {  // x's codes, then (residual) what they miss
      const float step = row == 0 ? CodeStep(amax) : CodeStep(amax) / kResidualSteps;  // the residual's grid
      const int32_t* half = sums + 2 * row;
      float* s = xs + row * 2 * KB + 2 * b;
      s[0] = step, s[1] = step * static_cast<float>(half[0] + half[1]);
      if (halves) {
        float* h = halves + row * 2 * KB + 2 * b;
        h[0] = step * static_cast<float>(half[0]), h[1] = step * static_cast<float>(half[1]);
      }
    }
  }
}

}  // namespace

void QuantizeRows(const float* x, int64_t T, int64_t K, bool residual, int8_t* xq, float* xs, float* halves) {
  const int64_t KB = (K + kQBlock - 1) / kQBlock, rows = residual ? 2 : 1;
  for (int64_t t = 0; t < T; ++t)
    QuantizeRow(x + t * K, K, KB, residual, xq + t * rows * KB * kQBlock, xs + t * rows * KB * 2,
                halves ? halves + t * rows * KB * 2 : nullptr);
}

void AdaptRows(int bits, int8_t* xq, int64_t count) {
  if ((bits != kQ3K && bits != kQ6K) || !kSub16UnsignedRows) return;
  uint8_t* bytes = reinterpret_cast<uint8_t*>(xq);
  for (int64_t i = 0; i < count; ++i) bytes[i] ^= 0x80;
}

void QTile(int bits, const uint8_t* codes, const void* scales, bool half, bool pairs, const int8_t* xq,
           const float* xs, const float* halves, const float* bias, float* y, int64_t KB, int64_t N, int64_t t0,
           int64_t t1, int64_t g0, int64_t g1) {
  if (bits == 4)
    TileOfBits<4>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == (4 | kQCentred))
    TileOfBits<4 | kQCentred>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == (5 | kQCentred))
    TileOfBits<5 | kQCentred>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == (8 | kQCentred))
    TileOfBits<8 | kQCentred>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == (kQ4NL | kQCentred))
    TileOfBits<kQ4NL | kQCentred>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == kQ4NL)
    TileOfBits<kQ4NL>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == kQ6K)
    TileOfBits<kQ6K>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == kQ2K)
    TileOfBits<kQ2K>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == kQ3K)
    TileOfBits<kQ3K>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == kQ4XS)
    TileOfBits<kQ4XS>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == kQ4K)
    TileOfBits<kQ4K>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == kQ5K)
    TileOfBits<kQ5K>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == 5)
    TileOfBits<5>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
  else
    TileOfBits<8>(codes, scales, half, pairs, xq, xs, halves, bias, y, KB, N, t0, t1, g0, g1);
}

}  // namespace ORTSERVE_ISA
}  // namespace ortserve
