// MatMulF kernels (see matmul_f_kernel.h), compiled once per ISA. A tile is up to kTileRows rows of x
// against one panel of 32 weight rows, its sums in registers across the whole K: per step along K,
// the panel's 128-byte row is loaded once and multiplied by each row's x[t, k] (broadcast). One row
// of x (decode) has too little arithmetic to need registers. On most CPUs one stream per core keeps too
// few cache lines in flight to read at the memory's speed: it reads the panel as 8 (AVX2: 2) streams,
// an eighth (half) of K each, whose sums are added at the end; a Zen 4 reads one stream a panel faster
// (row_streams, chosen by the op: matmul_f.cc).
#include "matmul_f_kernel.h"

#include "kernel_build.h"

#if defined(__AVX2__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own AVX-512 headers; see matmul_q_kernel.cc
#include <immintrin.h>
#endif

namespace ortserve {
namespace ORTSERVE_ISA {

namespace {

ALWAYS_INLINE int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }

#if defined(__AVX2__)
// Tiles of several rows read a panel once and compute for a while: the hardware prefetchers alone
// keep too few lines in flight, so ask for the panel's lines kPrefetchBytes ahead (past the panel's
// end that is the next panel, which follows it). 4 KiB, as MatMulQ (benchmarks/tables/matmul_f.md).
constexpr int64_t kPrefetchBytes = 4096;
#endif

// One pass's share of the next panel's lines, brought into L2 one every `every` steps of K while this
// panel's tiles compute (FTile). p == nullptr: none.
struct NextLines {
  const char *p = nullptr, *end = nullptr;
  int64_t every = 1, count = 1;
  ALWAYS_INLINE void Step() {
    if (p == nullptr || --count > 0) return;
    count = every;
    if (p < end) __builtin_prefetch(p, 0, 2);  // locality 2: L2 (prefetcht1)
    p += 64;
  }
};

#if defined(__AVX512F__)
constexpr int kTileRows = 8;
constexpr int kPassesPerTile = 1;  // passes over K per tile of rows
constexpr bool kHalvesApart = false;  // the panel layout (matmul_f_kernel.h)

// A step along K is one 128-byte row of the panel: two lines, kPrefetchBytes ahead.
ALWAYS_INLINE void PrefetchRow(const float* w) {
  const char* p = reinterpret_cast<const char*>(w) + kPrefetchBytes;
  _mm_prefetch(p, _MM_HINT_T0);
  _mm_prefetch(p + 64, _MM_HINT_T0);
}

ALWAYS_INLINE __mmask16 Mask(int64_t valid) { return valid >= 16 ? __mmask16(0xFFFF) : valid <= 0 ? 0 : __mmask16((1u << valid) - 1); }

// Stores the 32 sums of a row (lo: columns 0-15, hi: 16-31), bias added, the first `valid` only.
ALWAYS_INLINE void StoreRow(__m512 lo, __m512 hi, const float* bias, float* y, int64_t valid) {
  const __mmask16 m0 = Mask(valid), m1 = Mask(valid - 16);
  if (bias) {
    lo = _mm512_add_ps(lo, _mm512_maskz_loadu_ps(m0, bias));
    hi = _mm512_add_ps(hi, _mm512_maskz_loadu_ps(m1, bias + 16));
  }
  _mm512_mask_storeu_ps(y, m0, lo);
  _mm512_mask_storeu_ps(y + 16, m1, hi);
}

template <int MR, bool Prefetch>
ALWAYS_INLINE void PanelRows(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N,
                             int64_t valid, const NextLines* next) {
  NextLines lines = next[0];
  __m512 lo[MR], hi[MR];
  for (int i = 0; i < MR; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k, w += kFPanel) {
    if constexpr (Prefetch) PrefetchRow(w);
    lines.Step();
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_set1_ps(x[i * K + k]);
      lo[i] = _mm512_fmadd_ps(xv, w0, lo[i]);
      hi[i] = _mm512_fmadd_ps(xv, w1, hi[i]);
    }
  }
  for (int i = 0; i < MR; ++i) StoreRow(lo[i], hi[i], bias, y + i * N, valid);
}

// One row of x: the panel as S streams of K / S steps each (the last K % S steps on the first). On an
// Intel Xeon 8 streams read SmolLM2-135M's decode linears 4-6 % faster than 4 (benchmarks/tables/
// matmul_f.md); on a Zen 4 one stream reads them 1.1-1.5x faster than 2, 4 or 8
// (benchmarks/tables/amd_epyc_zen4.md).
template <int S>
ALWAYS_INLINE void PanelRowOf(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t valid) {
  const int64_t q = K / S;
  __m512 lo[S], hi[S];
  for (int s = 0; s < S; ++s) lo[s] = hi[s] = _mm512_setzero_ps();
  for (int64_t k = 0; k < q; ++k)
    for (int s = 0; s < S; ++s) {
      const float* ws = w + (s * q + k) * kFPanel;
      const __m512 xv = _mm512_set1_ps(x[s * q + k]);
      lo[s] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(ws), lo[s]);
      hi[s] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(ws + 16), hi[s]);
    }
  for (int64_t k = S * q; k < K; ++k) {
    const __m512 xv = _mm512_set1_ps(x[k]);
    lo[0] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + k * kFPanel), lo[0]);
    hi[0] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + k * kFPanel + 16), hi[0]);
  }
  for (int s = 1; s < S; ++s) lo[0] = _mm512_add_ps(lo[0], lo[s]), hi[0] = _mm512_add_ps(hi[0], hi[s]);
  StoreRow(lo[0], hi[0], bias, y, valid);
}

ALWAYS_INLINE void PanelRow(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t valid,
                            int row_streams) {
  if (row_streams == 1) return PanelRowOf<1>(x, K, w, bias, y, valid);
  PanelRowOf<8>(x, K, w, bias, y, valid);
}

#elif defined(__AVX2__)
constexpr int kTileRows = 6;  // 6 rows x 16 columns: 12 sums, 2 weight vectors and a broadcast in 16 registers
constexpr int kPassesPerTile = 2;  // a tile is two passes over K, one per half of the panel
// Each half of a panel is K x 16 apart from the other, so a pass reads one dense stream: in the [K, 32]
// layout it read every other line, and the lines it skipped crowded the caches (prefill and 16-row
// batches 1.05-1.4x, benchmarks/tables/avx2_zen3.md).
constexpr bool kHalvesApart = true;
constexpr int64_t kHalf = kFPanel / 2;

// Stores 8 sums, bias added, the first `valid` only (a masked store: no scalar tail to keep GCC from
// holding the sums in registers).
ALWAYS_INLINE void Store8(__m256 v, const float* bias, float* y, int64_t valid) {
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid < 0 ? 0 : valid > 8 ? 8 : valid)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  if (bias) v = _mm256_add_ps(v, _mm256_maskload_ps(bias, mask));
  _mm256_maskstore_ps(y, mask, v);
}

// Rows [0, MR) of x against one half of the panel (w: its K x 16). Its own function, sums and loop:
// with the two halves in one loop nest GCC 12 kept the sums in registers but stored them to the stack
// at every step.
template <int MR, bool Prefetch>
ALWAYS_INLINE void HalfPanel(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N,
                             int64_t valid, NextLines lines) {
  __m256 lo[MR], hi[MR];
  for (int i = 0; i < MR; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k, w += kHalf) {  // one 64-byte line a step
    if constexpr (Prefetch) _mm_prefetch(reinterpret_cast<const char*>(w) + kPrefetchBytes, _MM_HINT_T0);
    lines.Step();
    const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_broadcast_ss(x + i * K + k);
      lo[i] = _mm256_fmadd_ps(xv, w0, lo[i]);
      hi[i] = _mm256_fmadd_ps(xv, w1, hi[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    Store8(lo[i], bias, y + i * N, valid);
    Store8(hi[i], bias ? bias + 8 : nullptr, y + i * N + 8, valid - 8);
  }
}

// Rows [0, MR) of x against the panel, one half at a time.
template <int MR, bool Prefetch>
ALWAYS_INLINE void PanelRows(const float* x, int64_t K, const float* panel, const float* bias, float* y, int64_t N,
                             int64_t valid, const NextLines* next) {
  HalfPanel<MR, Prefetch>(x, K, panel, bias, y, N, valid, next[0]);
  if (valid > kHalf)
    HalfPanel<MR, Prefetch>(x, K, panel + kHalf * K, bias ? bias + kHalf : nullptr, y + kHalf, N, valid - kHalf, next[1]);
}

// One row of x: the whole panel as 2 streams, its halves (2 vectors a step each), with two sums a
// vector (even and odd steps) so that 8 chains of FMAs are in flight (whatever row_streams says).
ALWAYS_INLINE void PanelRow(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t valid,
                            int /*row_streams*/) {
  __m256 a[2][4];  // [half][even lo, even hi, odd lo, odd hi]
  for (int h = 0; h < 2; ++h)
    for (int v = 0; v < 4; ++v) a[h][v] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 2 <= K; k += 2)
    for (int h = 0; h < 2; ++h) {
      const float* wh = w + h * kHalf * K + k * kHalf;
      for (int j = 0; j < 2; ++j) {
        const __m256 xv = _mm256_broadcast_ss(x + k + j);
        a[h][2 * j] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wh + j * kHalf), a[h][2 * j]);
        a[h][2 * j + 1] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wh + j * kHalf + 8), a[h][2 * j + 1]);
      }
    }
  if (k < K) {
    const __m256 xv = _mm256_broadcast_ss(x + k);
    for (int h = 0; h < 2; ++h) {
      const float* wh = w + h * kHalf * K + k * kHalf;
      a[h][0] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wh), a[h][0]);
      a[h][1] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wh + 8), a[h][1]);
    }
  }
  for (int h = 0; h < 2; ++h)
    for (int v = 0; v < 2; ++v) {
      const int64_t column = h * kHalf + 8 * v;
      Store8(_mm256_add_ps(a[h][v], a[h][v + 2]), bias ? bias + column : nullptr, y + column, valid - column);
    }
}

#else
constexpr int kTileRows = 4;
constexpr int kPassesPerTile = 1;
constexpr bool kHalvesApart = false;

template <int MR, bool>
ALWAYS_INLINE void PanelRows(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N,
                             int64_t valid, const NextLines*) {
  float acc[MR][kFPanel] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int i = 0; i < MR; ++i)
      for (int64_t j = 0; j < kFPanel; ++j) acc[i][j] += x[i * K + k] * w[k * kFPanel + j];
  for (int i = 0; i < MR; ++i)
    for (int64_t j = 0; j < valid; ++j) y[i * N + j] = acc[i][j] + (bias ? bias[j] : 0.f);
}

ALWAYS_INLINE void PanelRow(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t valid,
                            int /*row_streams*/) {
  const NextLines none[kPassesPerTile];
  PanelRows<1, false>(x, K, w, bias, y, 0, valid, none);
}
#endif

// The last rows < kTileRows of a range, in one pass over the panel.
template <int MR, bool Prefetch>
void LastRows(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N, int64_t rows,
              int64_t valid, const NextLines* next) {
  if constexpr (MR > 1) {
    if (rows < MR) return LastRows<MR - 1, Prefetch>(x, K, w, bias, y, N, rows, valid, next);
  }
  PanelRows<MR, Prefetch>(x, K, w, bias, y, N, valid, next);
}

// The next panel's 2K lines, shared out among the `passes` passes over K that this panel's tiles make:
// pass j brings in lines [j share, (j + 1) share), one every `every` steps.
void ShareNextPanel(const char* next, int64_t K, int64_t passes, NextLines* lines) {
  const int64_t total = 2 * K, share = (total + passes - 1) / passes, every = K / share > 1 ? K / share : 1;
  for (int64_t j = 0; j < passes; ++j)
    lines[j] = {next + MinI(j * share, total) * 64, next + MinI((j + 1) * share, total) * 64, every, 1};
}

}  // namespace

void FPack(const float* w, int64_t N, int64_t K, float* panels) {
  for (int64_t i = 0; i < PackedFloats(N, K); ++i) panels[i] = 0.f;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t j = n % kFPanel;
    float* panel = panels + n / kFPanel * K * kFPanel;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t at = kHalvesApart ? j / (kFPanel / 2) * (kFPanel / 2) * K + k * (kFPanel / 2) + j % (kFPanel / 2)
                                      : k * kFPanel + j;
      panel[at] = w[n * K + k];
    }
  }
}

void FTile(const float* x, int64_t K, const float* panels, const float* bias, float* y, int64_t N, int64_t t0,
           int64_t t1, int64_t p0, int64_t p1, int row_streams) {
  const int64_t tiles = (t1 - t0 + kTileRows - 1) / kTileRows;
  constexpr int64_t kMaxTiles = 64 / kTileRows + 1;  // MatMulF's tasks: 64 rows at most (more: no prefetch)
  NextLines lines[kMaxTiles * kPassesPerTile];
  for (int64_t p = p0; p < p1; ++p) {  // a panel stays in cache while every tile of rows passes
    const float* w = panels + p * K * kFPanel;
    const int64_t n0 = p * kFPanel, valid = MinI(kFPanel, N - n0);
    const float* b = bias ? bias + n0 : nullptr;
    if (t1 - t0 == 1) {
      PanelRow(x + t0 * K, K, w, b, y + t0 * N + n0, valid, row_streams);
      continue;
    }
    // One tile of rows brings the panel in, prefetching it 4 KiB ahead. With several, the memory would
    // idle while the later tiles compute from cache, so every pass over K also brings in its share of
    // the next panel, and the tiles of the next panel find it in cache (benchmarks/tables/matmul_f.md).
    const bool several = tiles > 1 && tiles <= kMaxTiles;
    for (NextLines& l : lines) l = NextLines{};
    if (several && p + 1 < p1)
      ShareNextPanel(reinterpret_cast<const char*>(w + K * kFPanel), K, tiles * kPassesPerTile, lines);
    int64_t t = t0;
    const NextLines* next = lines;
    if (t + kTileRows <= t1) {
      if (!several || p == p0) PanelRows<kTileRows, true>(x + t * K, K, w, b, y + t * N + n0, N, valid, next);
      else PanelRows<kTileRows, false>(x + t * K, K, w, b, y + t * N + n0, N, valid, next);
      t += kTileRows;
      next += kPassesPerTile;
    } else {
      LastRows<kTileRows - 1, true>(x + t * K, K, w, b, y + t * N + n0, N, t1 - t, valid, next);
      continue;
    }
    for (; t + kTileRows <= t1; t += kTileRows, next += kPassesPerTile)
      PanelRows<kTileRows, false>(x + t * K, K, w, b, y + t * N + n0, N, valid, next);
    if (t < t1) LastRows<kTileRows - 1, false>(x + t * K, K, w, b, y + t * N + n0, N, t1 - t, valid, next);
  }
}

}  // namespace ORTSERVE_ISA
}  // namespace ortserve
