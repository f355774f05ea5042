// PagedAttention kernel: one work item = up to 16 query vectors (lanes) of one kv head against
// a range of cached positions, with online softmax over chunks of 16 positions.
// Compiled three times (CMakeLists.txt), with ORTSERVE_ISA = avx512 | avx2 | generic and the
// matching -m flags; the op picks a build at run time. GCC vector extensions keep one source:
// a vector holds one value per lane (query), so every loop over head_size is plain FMAs with a
// broadcast key/value element, and head_size needs no tail handling. A work item's lanes are one
// register (AVX-512: 16, or 8 for small decode groups) or two (AVX2: 16 lanes in two 8-lane
// registers, so each broadcast key or value element feeds two FMAs); the loops work register by
// register, since GCC spills vector types wider than the registers. One query row of a small GQA
// group (decode with at most 4 query heads a kv head) runs with lanes over head_size instead
// (paged_attention_few_heads.h).
// Uses nothing from the C++ standard library, so no inline function is shared between builds.
// The caches may hold float, half or int8 rows (CacheType): each 16-row chunk is read as floats,
// converted into a scratch buffer first when the cache is not float (but the few-heads kernel converts
// half and int8 rows register by register as it loads them).
#include "paged_attention_kernel.h"

#include "kernel_build.h"

namespace ortserve {
namespace ORTSERVE_ISA {
namespace {

constexpr int kChunk = 16;         // positions per online-softmax step
constexpr float kMasked = -1e30f;  // score of a masked position (finite, so max - max is 0)

#include "simd_math.h"  // V<W>, Splat, Max, Min, Exp, Softcap, HalvesToFloats, CodesToFloats: in this ISA's namespace

// Keys a pass over D takes at once: 8 when a lane vector is one register; 4 when it is two (16 lanes
// with 256-bit registers), so the 2 x 4 sums, the query's two registers and a broadcast still fit in
// 16 registers and each broadcast key element feeds two FMAs.
template <int W>
constexpr int kKeysPerPass = W > kRegisterLanes ? 4 : 8;

// A prefetch of one cache line of a later chunk's rows into L2, not L1 (prefetcht1): the core keeps
// more misses to L2 in flight than to L1, so scattered 4 KiB blocks stream faster (AMD EPYC Zen 4:
// 27-29 GB/s against 17-21 with prefetcht0 or none, benchmarks/tables/amd_epyc_zen4.md).
ALWAYS_INLINE void PrefetchLine(const unsigned char* line) { __builtin_prefetch(line, 0, 2); }

// Step d of a loop over D prefetches line d / NK of row d % NK of the next chunk's NK raw cache rows,
// while that line is inside the row (NK rows x row_bytes / 64 lines): spread out, the loads overlap
// the math.
template <int NK>
ALWAYS_INLINE void PrefetchStep(const unsigned char* const* rows, int64_t d, int64_t row_bytes) {
  if ((d / NK) * 64 < row_bytes) PrefetchLine(rows[d % NK] + (d / NK) * 64);
}

// The hot loops below work on register-wide pieces of a lane vector (R, P of them): GCC spills the
// wider vector types of V<16> on 256-bit builds.
template <int W>
constexpr int kPieceLanes = W < kRegisterLanes ? W : kRegisterLanes;

// s[j][lane] = <q_lane, k_j> for NK keys: qt is [D][W] (lanes innermost), k_j a row of floats.
template <int W, int NK>
ALWAYS_INLINE void Scores(const float* qt, const float* const* k, float (*s)[W], int64_t D,
                          const unsigned char* const* prefetch, int64_t row_bytes) {
  constexpr int L = kPieceLanes<W>, P = W / L;
  typedef typename V<L>::F R;
  const float* key[NK];
  R sum[NK][P];
#pragma GCC unroll 8
  for (int j = 0; j < NK; ++j) {
    key[j] = k[j];
    for (int i = 0; i < P; ++i) sum[j][i] = R{};
  }
  for (int64_t d = 0; d < D; ++d) {
    PrefetchStep<NK>(prefetch, d, row_bytes);
    R q[P];
    for (int i = 0; i < P; ++i) q[i] = *reinterpret_cast<const R*>(qt + d * W + i * L);
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) {
      const float e = key[j][d];
      for (int i = 0; i < P; ++i) sum[j][i] += q[i] * e;
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NK; ++j) __builtin_memcpy(s[j], sum[j], sizeof(sum[j]));
}

// acc[d] = acc[d] * alpha + sum_j p[j] * v_j[d] for NK value rows; acc is [D][W], p[j] and alpha
// [W] (alpha nullptr: 1).
template <int W, int NK>
ALWAYS_INLINE void Accumulate(float* acc, const float* const* v, const float (*p)[W], const float* alpha, int64_t D,
                              const unsigned char* const* prefetch, int64_t row_bytes) {
  constexpr int L = kPieceLanes<W>, P = W / L;
  typedef typename V<L>::F R;
  const float* value[NK];
  R weight[NK][P], scale[P];
  for (int i = 0; i < P; ++i) scale[i] = alpha ? *reinterpret_cast<const R*>(alpha + i * L) : Splat<R>(1.f);
#pragma GCC unroll 8
  for (int j = 0; j < NK; ++j) value[j] = v[j], __builtin_memcpy(weight[j], p[j], sizeof(weight[j]));
  for (int64_t d = 0; d < D; ++d) {
    PrefetchStep<NK>(prefetch, d, row_bytes);
    float e[NK];
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) e[j] = value[j][d];
    for (int i = 0; i < P; ++i) {
      R* a = reinterpret_cast<R*>(acc + d * W + i * L);
      R even = *a * scale[i], odd = weight[1][i] * e[1];  // two chains halve the latency
#pragma GCC unroll 8
      for (int j = 0; j < NK; j += 2) even += weight[j][i] * e[j];
#pragma GCC unroll 8
      for (int j = 3; j < NK; j += 2) odd += weight[j][i] * e[j];
      *a = even + odd;
    }
  }
}

// Walks a sequence's cached positions block by block, 16 rows at a time.
struct RowCursor {
  const unsigned char *kc, *vc;
  const int32_t* table;  // this sequence's block table
  int64_t block_size, block_stride, row_bytes, head_offset, blk, off, pos, end;
  RowCursor(const Problem& p, const int32_t* t, int64_t kv_head, int64_t begin, int64_t e)
      : kc(p.kc), vc(p.vc), table(t), block_size(p.block_size), block_stride(p.KVH * p.block_size * p.row_bytes),
        row_bytes(p.row_bytes), head_offset(kv_head * p.block_size * p.row_bytes), blk(begin / p.block_size),
        off(begin % p.block_size), pos(begin), end(e) {}
  // The raw K and V rows of the next 16 positions (past the end: repeats of the last).
  ALWAYS_INLINE void Next(const unsigned char** k, const unsigned char** v) {
    for (int j = 0; j < kChunk; ++j, ++pos) {
      if (pos < end) {
        const int64_t row = table[blk] * block_stride + head_offset + off * row_bytes;
        k[j] = kc + row, v[j] = vc + row;
        if (++off == block_size) off = 0, ++blk;
      } else {
        k[j] = k[j - 1], v[j] = v[j - 1];
      }
    }
  }
};

// An int8 row's scale, stored after its D codes.
ALWAYS_INLINE float RowScale(const unsigned char* row, int64_t D) {
  float scale;
  __builtin_memcpy(&scale, row + D, 4);
  return scale;
}

// One raw cache row -> D floats in `out`.
template <CacheType C>
ALWAYS_INLINE void RowToFloats(const unsigned char* row, float* out, int64_t D) {
  if constexpr (C == CacheType::kF16) {
    HalvesToFloats(row, out, D);
  } else {  // kI8: codes times the row's scale
    CodesToFloats(row, RowScale(row, D), out, D);
  }
}

// Float views of 16 raw rows: the rows themselves for a float cache, else converted into scratch.
template <CacheType C>
ALWAYS_INLINE void ChunkRows(const unsigned char* const* raw, float* scratch, const float** rows, int n,
                             int64_t D) {
  for (int j = 0; j < kChunk; ++j) {
    if constexpr (C == CacheType::kF32) {
      rows[j] = reinterpret_cast<const float*>(raw[j]);
    } else if (j < n) {
      RowToFloats<C>(raw[j], scratch + j * D, D);
      rows[j] = scratch + j * D;
    } else {
      rows[j] = rows[j - 1];  // padding: masked, never weighed
    }
  }
}

// A work item's cached positions, one chunk of kChunk at a time: the chunk's K and V rows as floats
// and the next chunk's raw rows. Raw row pointers are double-buffered so that the passes over a
// chunk can prefetch the next chunk's rows: cache blocks are scattered and the hardware prefetcher
// stops at every block edge. (The last chunk "prefetches" its own rows: cache hits.)
template <CacheType C, bool kConvert = true>
struct ChunkWalk {
  ChunkWalk(const Problem& P, const WorkItem& w)
      : cursor(P, P.block_tables + w.seq * P.max_blocks, w.kv_head, w.key_begin, w.key_end), end(w.key_end) {
    cursor.Next(raw[0][0], raw[0][1]);
  }
  // The chunk at position c, the one after the last call's: sets k, v (kChunk rows each; past the
  // returned count of positions, repeats of the last, never weighed) and next_k, next_v.
  ALWAYS_INLINE int Load(int64_t c, int64_t D) {
    const int n = static_cast<int>(end - c < kChunk ? end - c : kChunk);
    if constexpr (kConvert) {
      ChunkRows<C>(raw[cur][0], scratch[0], rows[0], n, D);
      ChunkRows<C>(raw[cur][1], scratch[1], rows[1], n, D);
    }
    raw_k = raw[cur][0], raw_v = raw[cur][1];
    const bool more = c + kChunk < end;
    if (more) cursor.Next(raw[cur ^ 1][0], raw[cur ^ 1][1]);
    next_k = raw[more ? cur ^ 1 : cur][0], next_v = raw[more ? cur ^ 1 : cur][1];
    cur ^= 1;
    return n;
  }
  RowCursor cursor;
  int64_t end;
  int cur = 0;
  const unsigned char* raw[2][2][kChunk];  // [buffer][key, value][position in chunk]
  // converted K and V rows of the chunk (fp16 / int8 caches): 32 KiB at most
  alignas(64) float scratch[2][C == CacheType::kF32 || !kConvert ? 1 : kChunk * kMaxHeadSize];
  const float* rows[2][kChunk];  // float views of this chunk's [key, value] rows
  const float *const *k = rows[0], *const *v = rows[1];
  const unsigned char *const *next_k = nullptr, *const *next_v = nullptr;
  const unsigned char *const *raw_k = nullptr, *const *raw_v = nullptr;  // this chunk's raw rows
};

template <int W, CacheType C>
void RunTile(const Problem& P, const WorkItem& w) {
  constexpr int L = kPieceLanes<W>, NP = W / L, NK = kKeysPerPass<W>;
  typedef typename V<L>::F R;  // a register-wide piece of a lane vector
  typedef typename V<L>::I RI;
  alignas(64) float qt[kMaxHeadSize * W], acc[kMaxHeadSize * W];  // 32 KiB of stack at most
  alignas(64) int32_t lo_lane[W], hi_lane[W];
  const int64_t D = P.D, heads = w.head_end - w.head_begin, row_bytes = P.row_bytes;
  const int64_t qs = P.qsl[w.seq], q_len = P.qsl[w.seq + 1] - qs, ctx = P.context_lens[w.seq];

  // Lanes: query vector (row, head) -> visible positions [lo, hi]; unused lanes see nothing.
  for (int m = 0; m < W; ++m) lo_lane[m] = 0x7fffffff, hi_lane[m] = -1;
  for (int64_t d = 0; d < D * W; ++d) qt[d] = 0.f, acc[d] = 0.f;
  for (int64_t r = w.row_begin; r < w.row_end; ++r) {
    const int64_t pos = ctx - q_len + (r - qs);  // absolute position of query row r
    const int64_t lo = (P.window > 0 && pos - P.window + 1 > 0) ? pos - P.window + 1 : 0;
    for (int64_t h = w.head_begin; h < w.head_end; ++h) {
      const int64_t m = (r - w.row_begin) * heads + (h - w.head_begin);
      lo_lane[m] = static_cast<int32_t>(lo), hi_lane[m] = static_cast<int32_t>(pos);
      const float* q = P.q + (r * P.H + h) * D;
      for (int64_t d = 0; d < D; ++d) qt[d * W + m] = q[d] * P.scale;  // scale folded into q
    }
  }

  alignas(64) float run_max[W], run_sum[W];
  for (int m = 0; m < W; ++m) run_max[m] = kMasked, run_sum[m] = 0.f;
  ChunkWalk<C> walk(P, w);
  for (int64_t c = w.key_begin; c < w.key_end; c += kChunk) {
    const int n = walk.Load(c, D);
    const float *const *k = walk.k, *const *v = walk.v;
    const unsigned char *const *next_k = walk.next_k, *const *next_v = walk.next_v;
    alignas(64) float s[kChunk][W], p[kChunk][W], alpha[W];  // scores, then weights, by position and lane
    for (int j = 0; j < n; j += NK) Scores<W, NK>(qt, k + j, s + j, D, next_k + j, row_bytes);
    // Per piece of lanes: mask positions outside [lo, hi] (and the padding), then online softmax:
    // m' = max(m, max_j s_j); acc and sum are rescaled by e^{m - m'}.
    for (int i = 0; i < NP; ++i) {
      const RI lo = *reinterpret_cast<const RI*>(lo_lane + i * L), hi = *reinterpret_cast<const RI*>(hi_lane + i * L);
      R chunk_max = Splat<R>(kMasked), sc[kChunk];
      RI valid[kChunk];
      for (int j = 0; j < kChunk; ++j) {
        const RI pos = RI{} + static_cast<int32_t>(c + j);
        valid[j] = j < n ? ((pos >= lo) & (pos <= hi)) : RI{};
        sc[j] = *reinterpret_cast<const R*>(s[j] + i * L);
        if (P.softcap > 0.f) sc[j] = Softcap<R, RI>(sc[j], P.softcap);  // s = c tanh(s / c)
        sc[j] = valid[j] ? sc[j] : Splat<R>(kMasked);
        chunk_max = Max(chunk_max, sc[j]);
      }
      R& m = *reinterpret_cast<R*>(run_max + i * L);
      const R new_max = Max(m, chunk_max);
      R chunk_sum{};
      for (int j = 0; j < kChunk; ++j) {
        const R pj = valid[j] ? Exp<R, RI>(sc[j] - new_max) : R{};  // p_j = e^{s_j - m'}
        *reinterpret_cast<R*>(p[j] + i * L) = pj;
        chunk_sum += pj;
      }
      const R a = Exp<R, RI>(m - new_max);
      *reinterpret_cast<R*>(alpha + i * L) = a;
      R& sum = *reinterpret_cast<R*>(run_sum + i * L);
      sum = sum * a + chunk_sum;
      m = new_max;
    }
    for (int j = 0; j < n; j += NK)  // acc = acc e^{m - m'} + sum_j p_j v_j
      Accumulate<W, NK>(acc, v + j, p + j, j == 0 ? alpha : nullptr, D, next_v + j, row_bytes);
  }

  if (w.partial) {  // split-K piece: (max, sum, unnormalised acc), merged by the op
    for (int m = 0; m < W; ++m) w.partial[m] = run_max[m], w.partial[kMaxLanes + m] = run_sum[m];
    float* part_acc = w.partial + 2 * kMaxLanes;
    for (int64_t d = 0; d < D; ++d)
      for (int m = 0; m < W; ++m) part_acc[d * kMaxLanes + m] = acc[d * W + m];
    return;
  }
  for (int64_t r = w.row_begin; r < w.row_end; ++r) {
    for (int64_t h = w.head_begin; h < w.head_end; ++h) {
      const int64_t m = (r - w.row_begin) * heads + (h - w.head_begin);
      const float inv = 1.f / run_sum[m];  // out = acc / sum
      float* out = P.out + (r * P.H + h) * D;
      for (int64_t d = 0; d < D; ++d) out[d] = acc[d * W + m] * inv;
    }
  }
}

template <int W>
void RunTileOf(const Problem& p, const WorkItem& w) {
  switch (p.cache) {
    case CacheType::kF16: return RunTile<W, CacheType::kF16>(p, w);
    case CacheType::kI8: return RunTile<W, CacheType::kI8>(p, w);
    default: return RunTile<W, CacheType::kF32>(p, w);
  }
}

#include "paged_attention_few_heads.h"  // RunFewHeadsOf, FewHeads: one row of a small group

}  // namespace

int TileLanes() { return kRegisterLanes >= 8 ? 16 : 8; }  // 16 lanes: one or two registers

void RunWorkItem(const Problem& p, const WorkItem& w) {
  const int64_t lanes = (w.row_end - w.row_begin) * (w.head_end - w.head_begin);
  if (FewHeads(p, w)) {
    switch (p.cache) {
      case CacheType::kF16: return RunFewHeadsOf<CacheType::kF16>(p, w);
      case CacheType::kI8: return RunFewHeadsOf<CacheType::kI8>(p, w);
      default: return RunFewHeadsOf<CacheType::kF32>(p, w);
    }
  } else if (lanes <= 8) {
    RunTileOf<8>(p, w);  // decode with a small GQA group: 8-lane vectors waste fewer lanes
  } else {
    RunTileOf<16>(p, w);
  }
}

}  // namespace ORTSERVE_ISA
}  // namespace ortserve
