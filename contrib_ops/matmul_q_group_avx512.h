// MatMulQ's group kernel for AVX-512 VNNI (see matmul_q_kernel.cc): kTileRows, kRowsOuter, BlockAmax, QuantizeAt,
// QuantizePairAt and GroupRows, one int32 lane per weight row (vpdpbusd: u8 codes up to 255, Q4NL's too), and BlockDM. Included INSIDE
// matmul_q_kernel.cc's ISA namespace, after its shared helpers; no includes of its own.

// 16 int8 rows (8 pairs) share each unpacked block; 8 rows was 5-20 % slower on a Zen 4 at 32-512 rows
// (benchmarks/tables/amd_epyc_zen4.md). Prefill tasks take their tiles of rows outer (kRowsOuter): a
// tile's activations stay in L1 while the task's groups' codes pass from L2.
constexpr int kTileRows = 16;
constexpr bool kRowsOuter = true;

// Only the AVX2 build widens a block's codes once for many pairs (matmul_q_group_avx2.h); declared for
// matmul_q_kernel.cc's Tile, which never calls it here.
constexpr int64_t kWidenedMaxPairs = 0, kWidenedMaxBlocks = 0;
template <int Bits, typename S>
void GroupPairsWidenedOnce(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                           const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                           int64_t KB, int64_t valid, int64_t pairs);

ALWAYS_INLINE float BlockAmax(const float* in) {
  const __m512 a = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(in)), _mm512_abs_ps(_mm512_loadu_ps(in + 16)));
  return _mm512_reduce_max_ps(a);
}

// Codes of 16 values, clamped to +-127 (one int32 lane each).
ALWAYS_INLINE __m512i Codes16(__m512 scaled) {
  const __m512i q = _mm512_cvtps_epi32(scaled);
  return _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
}

ALWAYS_INLINE void Store16(__m512i q, int8_t* out) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtsepi32_epi8(q));
}

// The block's codes into out, and the sums of its halves' (columns 0..15, 16..31) into halves.
ALWAYS_INLINE void QuantizeAt(const float* in, float inverse, int8_t* out, int32_t* halves) {
  const __m512 id = _mm512_set1_ps(inverse);
  const __m512i q0 = Codes16(_mm512_mul_ps(_mm512_loadu_ps(in), id));
  const __m512i q1 = Codes16(_mm512_mul_ps(_mm512_loadu_ps(in + 16), id));
  Store16(q0, out);
  Store16(q1, out + 16);
  halves[0] = _mm512_reduce_add_epi32(q0);
  halves[1] = _mm512_reduce_add_epi32(q1);
}

// QuantizeAt, and in the same pass the codes of what it misses, x - dx * q rounded once, on the grid
// kResidualSteps times finer (block b of the pair's rows: codes, then the residual's; sums: the halves' code sums,
// then the residual's).
ALWAYS_INLINE void QuantizePairAt(const float* in, float inverse, float dx, int8_t* pair, int64_t KB, int64_t b,
                                  int32_t* sums) {
  int8_t *out = pair + kQBlock * b, *fine_out = pair + kQBlock * (KB + b);  // the pair's two int8 rows
  const __m512 id = _mm512_set1_ps(inverse), fine = _mm512_set1_ps(inverse * kResidualSteps);
  const __m512 step = _mm512_set1_ps(dx);
  for (int j = 0; j < 2; ++j) {
    const __m512 x = _mm512_loadu_ps(in + 16 * j);
    const __m512i q = Codes16(_mm512_mul_ps(x, id));
    const __m512i r = Codes16(_mm512_mul_ps(_mm512_fnmadd_ps(step, _mm512_cvtepi32_ps(q), x), fine));
    Store16(q, out + 16 * j);
    Store16(r, fine_out + 16 * j);
    sums[j] = _mm512_reduce_add_epi32(q);
    sums[2 + j] = _mm512_reduce_add_epi32(r);
  }
}

template <typename S>
ALWAYS_INLINE __m512 Load16(const S* p) {
  if constexpr (sizeof(S) == 2) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  else return _mm512_loadu_ps(p);
}

// Block b's d and m of the 16 rows: as stored, -middle * d (centred), or (MatMulQ4K / Q5K) the super-block's d and
// -dmin times the block's u8 sub-scales and mins, which follow its codes at c (MatMulQ4XS: d times its int8 sub-scales,
// then centred).
template <int Bits, typename S>
ALWAYS_INLINE void BlockDM(const uint8_t* c, const S* scales, int64_t b, __m512& d, __m512& m) {
  const S* s = BlockScalesAt<Bits>(scales, b);
  d = Load16(s);
  if constexpr (kQCentredOf<Bits>) {
    if constexpr (kQSuperBlockDMOf<Bits>) {
      const __m128i sub = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + kQCodeBytesOf<Bits>));
      d = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sub)));
    }
    m = _mm512_mul_ps(d, _mm512_set1_ps(-kQMiddleOf<Bits>));
    return;
  }
  m = Load16(s + kQGroup);
  if constexpr (kQSuperBlockDMOf<Bits>) {
    const auto bytes = [&](int64_t at) {
      return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + at))));
    };
    d = _mm512_mul_ps(d, bytes(kQCodeBytesOf<Bits>));
    m = _mm512_mul_ps(m, bytes(kQCodeBytesOf<Bits> + kQGroup));
  }
}

// A block's integer dot products with one row of x: 16 weight rows, one int32 lane each.
ALWAYS_INLINE __m512i BlockDot(const __m512i* w, const int8_t* xb) {
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();  // two chains: half the latency
  for (int q = 0; q < 8; q += 2) {
    s0 = _mm512_dpbusd_epi32(s0, w[q], _mm512_set1_epi32(Load32(xb + 4 * q)));
    s1 = _mm512_dpbusd_epi32(s1, w[q + 1], _mm512_set1_epi32(Load32(xb + 4 * q + 4)));
  }
  return _mm512_add_epi32(s0, s1);
}

// Rows [0, MT) of x against one group: y[i, 0..valid) for each row i (Pairs: y[i / 2] from rows i and
// i + 1, an activation row and its residual, whose dot products add as integers: 256 * hi + lo).
template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRows(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                             const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                             int64_t KB, int64_t valid) {
  static_assert(!Pairs || MT % 2 == 0, "a pair is two rows");
  constexpr int kStep = Pairs ? 2 : 1, kOut = MT / kStep;
  __m512 acc[kOut];
  for (int o = 0; o < kOut; ++o) acc[o] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* c = codes + b * kQBlockBytesOf<Bits>;
    PrefetchAhead<Bits>(c, BlockScalesAt<Bits>(scales, b));
    constexpr int kCode = kQCodeOf<Bits>;
    __m512i w[8];  // w[q]: 16 rows x columns 4q..4q+3 of the block
    if constexpr (kCode == 4 || kCode == 5 || kCode == kQ4NL) {
      for (int j = 0; j < 4; ++j) {
        const __m512i raw = _mm512_loadu_si512(c + 64 * j);
        w[j] = _mm512_and_si512(raw, nibble);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
      }
      if constexpr (kCode == kQ4NL) {  // the nibbles index the 8-bit codes: vpshufb in each 128-bit lane
        const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kQ4NLCodes)));
        for (int q = 0; q < 8; ++q) w[q] = _mm512_shuffle_epi8(table, w[q]);
      }
      if constexpr (kCode == 5) {  // the fifth bits: one 64-bit lane mask per vector
        const __m512i sixteen = _mm512_set1_epi8(16);
        for (int q = 0; q < 8; ++q) {
          uint64_t fifth;
          __builtin_memcpy(&fifth, c + kQ4BlockBytes + 8 * q, 8);
          w[q] = _mm512_or_si512(w[q], _mm512_maskz_mov_epi8(fifth, sixteen));
        }
      }
    } else {
      for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(c + 64 * j);
    }
    __m512 d, m;
    BlockDM<Bits>(c, scales, b, d, m);
    for (int o = 0; o < kOut; ++o) {
      const int64_t i = o * kStep;
      const int8_t* xb = xq + i * xq_stride + b * kQBlock;
      const float* sc = xs + i * xs_stride + 2 * b;
      __m512i dot = BlockDot(w, xb);
      float dx = sc[0], sum = sc[1];
      if constexpr (Pairs) {  // the residual's scale: dx / 256
        dot = _mm512_add_epi32(_mm512_slli_epi32(dot, kResidualShift), BlockDot(w, xb + xq_stride));
        dx = sc[xs_stride], sum += sc[xs_stride + 1];
      }
      acc[o] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[o]);
      acc[o] = _mm512_fmadd_ps(m, _mm512_set1_ps(sum), acc[o]);
    }
  }
  const __mmask16 mask = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
  const __m512 add = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int o = 0; o < kOut; ++o) _mm512_mask_storeu_ps(y + o * y_stride, mask, _mm512_add_ps(acc[o], add));
}
