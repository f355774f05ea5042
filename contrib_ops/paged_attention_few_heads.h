// PagedAttention's kernel for one query row of a small GQA group (decode with at most kFewHeads
// query heads per kv head: SmolLM2's 3, Llama 3.2's and Gemma 3's 4). Lanes run over the head
// dimension instead of over query vectors, where 3 or 4 query vectors would leave most lanes idle
// and every multiply-add would need a broadcast of its own: here a key row is loaded once per
// register and meets each head's query in one FMA, a score is one horizontal sum, and a weight is
// splatted once per key and value register slice. Included INSIDE paged_attention_kernel.cc's ISA
// namespace, after its shared helpers (ChunkWalk, Exp, Softcap); no includes of its own.

constexpr int kFewHeads = 4;

// The sum of a vector's lanes, by halves.
template <int L>
ALWAYS_INLINE float LaneSum(typename V<L>::F x) {
  if constexpr (L == 2) {
    return x[0] + x[1];
  } else {
    typename V<L / 2>::F lo, hi;
    __builtin_memcpy(&lo, &x, sizeof(lo));
    __builtin_memcpy(&hi, reinterpret_cast<const char*>(&x) + sizeof(lo), sizeof(hi));
    return LaneSum<L / 2>(lo + hi);
  }
}

// A vector from a cache row, which need not be aligned to the vector's size (head_size 72: 288-byte rows).
template <class R>
ALWAYS_INLINE R LoadRow(const float* p) {
  R r;
  __builtin_memcpy(&r, p, sizeof(r));
  return r;
}

// Whether the item runs here: one row, a small group, and head_size in whole registers.
ALWAYS_INLINE bool FewHeads(const Problem& p, const WorkItem& w) {
  return w.row_end - w.row_begin == 1 && w.head_end - w.head_begin <= kFewHeads && p.D % kRegisterLanes == 0;
}

// kRegs: registers a row of head_size floats fills, when fixed at compile time (0: P.D / lanes): the
// loops over a row unroll and each head's partial dot product stays in a register.
template <CacheType C, int H, int kRegs>
void RunFewHeads(const Problem& P, const WorkItem& w) {
  // kSlice: value registers a pass over the chunk's rows keeps H x kSlice sums of (in 16 registers
  // with AVX2: 12 sums, 3 weights and the row for 3 heads, 8 + 4 + 1 for 4)
  constexpr int L = kRegisterLanes, kSlice = H <= 3 || L >= 16 ? 4 : 2;
  typedef typename V<L>::F R;
  alignas(64) float q[H][kMaxHeadSize], acc[H][kMaxHeadSize];
  const int64_t D = P.D, NC = kRegs ? kRegs : D / L, row_bytes = P.row_bytes;
  for (int h = 0; h < H; ++h) {
    const float* src = P.q + (w.row_begin * P.H + w.head_begin + h) * D;
    for (int64_t d = 0; d < D; ++d) q[h][d] = src[d] * P.scale, acc[h][d] = 0.f;  // scale folded into q
  }
  float run_max[H], run_sum[H];
  for (int h = 0; h < H; ++h) run_max[h] = kMasked, run_sum[h] = 0.f;

  // Visible positions: the item's key range (PlanWork clips it to the row's window and causal end).
  constexpr bool kHalves = C == CacheType::kF16 && kHalfRegisters, kCodes = C == CacheType::kI8 && kCodeRegisters;
  constexpr bool kRaw = kHalves || kCodes;  // rows read raw, converted register by register
  ChunkWalk<C, !kRaw> walk(P, w);
  for (int64_t c = w.key_begin; c < w.key_end; c += kChunk) {
    const int n = walk.Load(c, D);
    alignas(64) float s[H][kChunk];  // scores, then weights (0 past n)
    for (int j = 0; j < n; ++j) {
      for (int64_t line = 0; line < row_bytes; line += 64) PrefetchLine(walk.next_k[j] + line);  // keys here
      const float* k = kRaw ? nullptr : walk.k[j];
      R part[H] = {};
#pragma GCC unroll 16
      for (int64_t i = 0; i < NC; ++i) {
        const R kv = kHalves  ? HalvesRegister<R>(walk.raw_k[j] + i * sizeof(R) / 2)
                     : kCodes ? CodesRegister<R>(walk.raw_k[j] + i * sizeof(R) / 4)
                              : LoadRow<R>(k + i * L);
        for (int h = 0; h < H; ++h) part[h] += *reinterpret_cast<const R*>(q[h] + i * L) * kv;
      }
      const float k_scale = kCodes ? RowScale(walk.raw_k[j], D) : 1.f;  // s = scale * <q, codes>
      for (int h = 0; h < H; ++h) s[h][j] = LaneSum<L>(part[h]) * k_scale;
    }
    // Online softmax per head over the chunk's scores, kChunk / L registers each.
    static_assert(kChunk % L == 0, "a chunk is whole registers");
    constexpr int kPieces = kChunk / L, kPieceLanes = L;
    typedef typename V<kPieceLanes>::F S;
    typedef typename V<kPieceLanes>::I SI;
    float alpha[H];
    for (int h = 0; h < H; ++h) {
      S piece[kPieces];
      SI valid[kPieces];
      S chunk_max = Splat<S>(kMasked);
      for (int i = 0; i < kPieces; ++i) {
        __builtin_memcpy(&piece[i], s[h] + i * kPieceLanes, sizeof(S));
        SI pos{};
        for (int l = 0; l < kPieceLanes; ++l) pos[l] = i * kPieceLanes + l;
        valid[i] = pos < n;
        if (P.softcap > 0.f) piece[i] = Softcap<S, SI>(piece[i], P.softcap);  // s = c tanh(s / c)
        piece[i] = valid[i] ? piece[i] : Splat<S>(kMasked);
        chunk_max = Max(chunk_max, piece[i]);
      }
      float m = run_max[h];
      for (int l = 0; l < kPieceLanes; ++l) m = chunk_max[l] > m ? chunk_max[l] : m;
      const S new_max = Splat<S>(m);
      S chunk_sum{};
      for (int i = 0; i < kPieces; ++i) {
        const S p = valid[i] ? Exp<S, SI>(piece[i] - new_max) : S{};  // p_j = e^{s_j - m'}
        __builtin_memcpy(s[h] + i * kPieceLanes, &p, sizeof(S));
        chunk_sum += p;
      }
      alpha[h] = Exp<S, SI>(Splat<S>(run_max[h] - m))[0];
      run_sum[h] = run_sum[h] * alpha[h] + LaneSum<kPieceLanes>(chunk_sum);
      run_max[h] = m;
    }
    // acc_h = acc_h e^{m - m'} + sum_j p_hj v_j, kSlice value registers at a time.
    for (int64_t i0 = 0; i0 < NC; i0 += kSlice) {
      const int64_t slice = NC - i0 < kSlice ? NC - i0 : kSlice;
      R sum[H][kSlice];
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < kSlice; ++i)
          sum[h][i] = i < slice ? *reinterpret_cast<const R*>(acc[h] + (i0 + i) * L) * alpha[h] : R{};
      for (int j = 0; j < n; ++j) {
        if (i0 == 0)  // values here, so the chunk's prefetches spread over both passes
          for (int64_t line = 0; line < row_bytes; line += 64) PrefetchLine(walk.next_v[j] + line);
        const float* v = kRaw ? nullptr : walk.v[j] + i0 * L;
        const float v_scale = kCodes ? RowScale(walk.raw_v[j], D) : 1.f;  // folded into the weight
        R p[H];
        for (int h = 0; h < H; ++h) p[h] = Splat<R>(s[h][j] * v_scale);
        for (int i = 0; i < kSlice; ++i) {
          if (i >= slice) break;
          const R vv = kHalves  ? HalvesRegister<R>(walk.raw_v[j] + (i0 + i) * sizeof(R) / 2)
                       : kCodes ? CodesRegister<R>(walk.raw_v[j] + (i0 + i) * sizeof(R) / 4)
                                : LoadRow<R>(v + i * L);
          for (int h = 0; h < H; ++h) sum[h][i] += p[h] * vv;
        }
      }
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < slice; ++i) *reinterpret_cast<R*>(acc[h] + (i0 + i) * L) = sum[h][i];
    }
  }

  if (w.partial) {  // split-K piece: (max, sum, unnormalised acc), merged by the op
    for (int h = 0; h < H; ++h) {
      w.partial[h] = run_max[h], w.partial[kMaxLanes + h] = run_sum[h];
      for (int64_t d = 0; d < D; ++d) w.partial[2 * kMaxLanes + d * kMaxLanes + h] = acc[h][d];
    }
    return;
  }
  for (int h = 0; h < H; ++h) {
    const float inv = 1.f / run_sum[h];  // out = acc / sum
    float* out = P.out + (w.row_begin * P.H + w.head_begin + h) * D;
    for (int64_t d = 0; d < D; ++d) out[d] = acc[h][d] * inv;
  }
}

template <CacheType C, int kRegs>
void RunFewHeadsOfRegs(const Problem& p, const WorkItem& w) {
  switch (w.head_end - w.head_begin) {
    case 1: return RunFewHeads<C, 1, kRegs>(p, w);
    case 2: return RunFewHeads<C, 2, kRegs>(p, w);
    case 3: return RunFewHeads<C, 3, kRegs>(p, w);
    default: return RunFewHeads<C, 4, kRegs>(p, w);
  }
}

template <CacheType C>
void RunFewHeadsOf(const Problem& p, const WorkItem& w) {
  switch (p.D / kRegisterLanes) {  // head_size 64 or 128 in AVX-512 and AVX2 registers
    case 4: return RunFewHeadsOfRegs<C, 4>(p, w);
    case 8: return RunFewHeadsOfRegs<C, 8>(p, w);
    default: return RunFewHeadsOfRegs<C, 0>(p, w);
  }
}
