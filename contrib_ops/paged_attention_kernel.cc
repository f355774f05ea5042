// PagedAttention kernel: one work item = up to 16 query vectors (lanes) of one kv head against
// a range of cached positions, with online softmax over chunks of 16 positions.
// Compiled three times (CMakeLists.txt), with ORTSERVE_ISA = avx512 | avx2 | generic and the
// matching -m flags; the op picks a build at run time. GCC vector extensions keep one source:
// a vector holds one value per lane (query), so every loop over head_size is plain FMAs with a
// broadcast key/value element, and head_size needs no tail handling.
// Uses nothing from the C++ standard library, so no inline function is shared between builds.
// The caches may hold float, half or int8 rows (CacheType): each 16-row chunk is read as floats,
// converted into a scratch buffer first when the cache is not float.
#include "paged_attention_kernel.h"

#ifndef ORTSERVE_ISA
#error "compile with -DORTSERVE_ISA=avx512|avx2|generic"
#endif

#define ALWAYS_INLINE inline __attribute__((always_inline))

namespace ortserve {
namespace ORTSERVE_ISA {
namespace {

constexpr int kChunk = 16;         // positions per online-softmax step
constexpr float kMasked = -1e30f;  // score of a masked position (finite, so max - max is 0)

#include "simd_math.h"  // V<W>, Splat, Max, Min, Exp, Softcap, HalvesToFloats: in this ISA's namespace

// Step d of a loop over D prefetches line d / 8 of row d % 8 of the next chunk's 8 raw cache rows,
// while line d / 8 is inside the row (8 rows x row_bytes / 64 lines): spread out, the loads overlap
// the math.
ALWAYS_INLINE void PrefetchStep(const unsigned char* const* rows, int64_t d, int64_t row_bytes) {
  if ((d >> 3) * 64 < row_bytes) __builtin_prefetch(rows[d & 7] + (d >> 3) * 64);
}

// s[j] = <q_lane, k_j> for 8 keys: qt is [D][W] (lanes innermost), k_j a row of floats.
template <int W>
ALWAYS_INLINE void Scores8(const float* qt, const float* const* k, typename V<W>::F* s, int64_t D,
                           const unsigned char* const* prefetch, int64_t row_bytes) {
  typedef typename V<W>::F F;
  const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3], *k4 = k[4], *k5 = k[5], *k6 = k[6], *k7 = k[7];
  F s0{}, s1{}, s2{}, s3{}, s4{}, s5{}, s6{}, s7{};
  for (int64_t d = 0; d < D; ++d) {
    PrefetchStep(prefetch, d, row_bytes);
    const F q = *reinterpret_cast<const F*>(qt + d * W);
    s0 += q * k0[d], s1 += q * k1[d], s2 += q * k2[d], s3 += q * k3[d];
    s4 += q * k4[d], s5 += q * k5[d], s6 += q * k6[d], s7 += q * k7[d];
  }
  s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3, s[4] = s4, s[5] = s5, s[6] = s6, s[7] = s7;
}

// acc[d] = acc[d] * alpha + sum_j p[j] * v_j[d] for 8 value rows; acc is [D][W].
template <int W>
ALWAYS_INLINE void Accumulate8(float* acc, const float* const* v, const typename V<W>::F* p,
                               typename V<W>::F alpha, int64_t D, const unsigned char* const* prefetch,
                               int64_t row_bytes) {
  typedef typename V<W>::F F;
  const float *v0 = v[0], *v1 = v[1], *v2 = v[2], *v3 = v[3], *v4 = v[4], *v5 = v[5], *v6 = v[6], *v7 = v[7];
  const F p0 = p[0], p1 = p[1], p2 = p[2], p3 = p[3], p4 = p[4], p5 = p[5], p6 = p[6], p7 = p[7];
  for (int64_t d = 0; d < D; ++d) {
    PrefetchStep(prefetch, d, row_bytes);
    F* a = reinterpret_cast<F*>(acc + d * W);
    const F even = *a * alpha + p0 * v0[d] + p2 * v2[d] + p4 * v4[d] + p6 * v6[d];  // two chains
    const F odd = p1 * v1[d] + p3 * v3[d] + p5 * v5[d] + p7 * v7[d];              // halve latency
    *a = even + odd;
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

// One raw cache row -> D floats in `out`.
template <CacheType C>
ALWAYS_INLINE void RowToFloats(const unsigned char* row, float* out, int64_t D) {
  if constexpr (C == CacheType::kF16) {
    HalvesToFloats(row, out, D);
  } else {  // kI8: codes, then the row's scale
    typedef int8_t C16 __attribute__((vector_size(16)));
    typedef float F16 __attribute__((vector_size(64)));
    float scale;
    __builtin_memcpy(&scale, row + D, 4);
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
      C16 c;
      __builtin_memcpy(&c, row + d, 16);
      const F16 f = __builtin_convertvector(c, F16) * scale;
      __builtin_memcpy(out + d, &f, 64);
    }
    for (; d < D; ++d) out[d] = static_cast<float>(static_cast<int8_t>(row[d])) * scale;
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

template <int W, CacheType C>
void RunTile(const Problem& P, const WorkItem& w) {
  typedef typename V<W>::F F;
  typedef typename V<W>::I I;
  alignas(64) float qt[kMaxHeadSize * W], acc[kMaxHeadSize * W];  // 32 KiB of stack at most
  // converted K and V rows of the chunk (fp16 / int8 caches): 32 KiB more at most
  alignas(64) float scratch[2][C == CacheType::kF32 ? 1 : kChunk * kMaxHeadSize];
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
  const I lo = *reinterpret_cast<const I*>(lo_lane), hi = *reinterpret_cast<const I*>(hi_lane);

  F run_max = Splat<F>(kMasked), run_sum{};
  const int32_t* table = P.block_tables + w.seq * P.max_blocks;
  // Raw row pointers are double-buffered so that the passes over a chunk can prefetch the next
  // chunk's rows: cache blocks are scattered and the hardware prefetcher stops at every block
  // edge. (The last chunk "prefetches" its own rows: cache hits.)
  RowCursor cursor(P, table, w.kv_head, w.key_begin, w.key_end);
  const unsigned char* raw[2][2][kChunk];  // [buffer][key, value][position in chunk]
  const float* rows[2][kChunk];            // float views of this chunk's [key, value] rows
  cursor.Next(raw[0][0], raw[0][1]);
  int cur = 0;
  for (int64_t c = w.key_begin; c < w.key_end; c += kChunk, cur ^= 1) {
    const int n = static_cast<int>(w.key_end - c < kChunk ? w.key_end - c : kChunk);
    ChunkRows<C>(raw[cur][0], scratch[0], rows[0], n, D);
    ChunkRows<C>(raw[cur][1], scratch[1], rows[1], n, D);
    const bool more = c + kChunk < w.key_end;
    if (more) cursor.Next(raw[cur ^ 1][0], raw[cur ^ 1][1]);
    const unsigned char *const *next_k = raw[more ? cur ^ 1 : cur][0], *const *next_v = raw[more ? cur ^ 1 : cur][1];
    const float *const *k = rows[0], *const *v = rows[1];
    F s[kChunk], p[kChunk];
    Scores8<W>(qt, k, s, D, next_k, row_bytes);
    if (n > 8) Scores8<W>(qt, k + 8, s + 8, D, next_k + 8, row_bytes);
    // Mask positions outside [lo, hi] (and the padding), then the chunk's max per lane.
    F chunk_max = Splat<F>(kMasked);
    I valid[kChunk];
    for (int j = 0; j < kChunk; ++j) {
      const I pos = I{} + static_cast<int32_t>(c + j);
      valid[j] = j < n ? ((pos >= lo) & (pos <= hi)) : I{};
      if (P.softcap > 0.f) s[j] = Softcap<F, I>(s[j], P.softcap);  // s = c tanh(s / c)
      s[j] = valid[j] ? s[j] : Splat<F>(kMasked);
      chunk_max = Max(chunk_max, s[j]);
    }
    // Online softmax: m' = max(m, max_j s_j); acc and sum are rescaled by e^{m - m'}.
    const F new_max = Max(run_max, chunk_max);
    const F alpha = Exp<F, I>(run_max - new_max);
    F chunk_sum{};
    for (int j = 0; j < kChunk; ++j) {
      p[j] = valid[j] ? Exp<F, I>(s[j] - new_max) : F{};  // p_j = e^{s_j - m'}
      chunk_sum += p[j];
    }
    run_sum = run_sum * alpha + chunk_sum;
    run_max = new_max;
    Accumulate8<W>(acc, v, p, alpha, D, next_v, row_bytes);  // acc = acc e^{m - m'} + sum_j p_j v_j
    if (n > 8) Accumulate8<W>(acc, v + 8, p + 8, Splat<F>(1.f), D, next_v + 8, row_bytes);
  }

  alignas(64) float max_lane[W], sum_lane[W];
  *reinterpret_cast<F*>(max_lane) = run_max;
  *reinterpret_cast<F*>(sum_lane) = run_sum;
  if (w.partial) {  // split-K piece: (max, sum, unnormalised acc), merged by the op
    for (int m = 0; m < W; ++m) w.partial[m] = max_lane[m], w.partial[kMaxLanes + m] = sum_lane[m];
    float* part_acc = w.partial + 2 * kMaxLanes;
    for (int64_t d = 0; d < D; ++d)
      for (int m = 0; m < W; ++m) part_acc[d * kMaxLanes + m] = acc[d * W + m];
    return;
  }
  for (int64_t r = w.row_begin; r < w.row_end; ++r) {
    for (int64_t h = w.head_begin; h < w.head_end; ++h) {
      const int64_t m = (r - w.row_begin) * heads + (h - w.head_begin);
      const float inv = 1.f / sum_lane[m];  // out = acc / sum
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

}  // namespace

int TileLanes() { return kRegisterLanes >= 16 ? 16 : 8; }

void RunWorkItem(const Problem& p, const WorkItem& w) {
  const int64_t lanes = (w.row_end - w.row_begin) * (w.head_end - w.head_begin);
  if (lanes <= 8) {
    RunTileOf<8>(p, w);  // decode with a small GQA group: 8-lane vectors waste fewer lanes
  } else {
    RunTileOf<16>(p, w);
  }
}

}  // namespace ORTSERVE_ISA
}  // namespace ortserve
