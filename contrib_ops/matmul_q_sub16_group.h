// The group kernel of the sub16 layouts, MatMulQ2K, Q3K and Q6K, GroupRowsSub16, for each ISA (the layouts are in
// matmul_q_kernel.h). w = d * sc * (q - middle) has a scale per 16 columns, so each block of 32 gives two integer
// dot products a weight row, one per half, each scaled in float: acc[row] += dot_h * (sc_h[row] * d[row] * dx). The
// codes are taken as signed, s = q - middle (Q6K: -32..31, Q3K: -4..3, Q2K: 0..3), so no zero point is left over;
// MatMulQ2K's w = d * sc * q - dmin * mn adds its mins' terms, -dmin * mn_h[row] * dx * sum(xq) over each half
// (QuantizeRows' halves):
//   AVX-512 VNNI: vpdpbusd wants one unsigned operand, so the activations go in as x + 128 (x xor 0x80,
//     stored so once a call by AdaptRows), and the 128 * sum(s) that adds, a weight row and half, starts
//     the dot products' chains negated, worked out once a block for every row of x (MatMulQ2K's codes are
//     the unsigned operand);
//   AVX2, 8-bit activations: vpmaddubsw on |s| against x carrying s's sign (vpsignb): a chain of 4
//     (16 columns) stays below 4 * 2 * 32 * 127 = 32512 (Q6K), under int16's limit;
//   AVX2, 16-bit activations: s sign-extended to int16 pairs in vpmaddwd against the int16 codes;
//   generic: one code at a time.
// Included INSIDE matmul_q_kernel.cc's ISA namespace after the ISA's group kernel; no includes of its own.

// Where the group's d (MatMulQ2K: then its -dmin) of block b start.
template <int Bits, typename S>
ALWAYS_INLINE const S* Sub16ScalesAt(const S* scales, int64_t b) {
  return scales + b / kQSuperBlocks * (kQSub16MinsOf<Bits> ? 2 : 1) * kQGroup;
}

// MatMulQ2K's dx * sum(xq) over block b's two halves for row i of x (Pairs: the pair's rows i and i + 1, added).
template <bool Pairs>
ALWAYS_INLINE void HalvesOf(const float* hs, int64_t xs_stride, int64_t i, int64_t b, float& lo, float& hi) {
  const float* h = hs + i * xs_stride + 2 * b;
  lo = h[0], hi = h[1];
  if constexpr (Pairs) lo += h[xs_stride], hi += h[xs_stride + 1];
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)

// This build's MatMulQ3K and Q6K kernels read their activations as unsigned bytes, x + 128 (AdaptRows stores them
// so): a broadcast from memory costs no ALU op, where x xor 0x80 a block in the kernel (stored, then broadcast)
// took half as long again as the whole product.
constexpr bool kSub16UnsignedRows = true;

// A block's codes as signed bytes: w[v] holds the 16 rows x columns 4v..4v+3 (v < 4: the first half).
template <int Bits>
ALWAYS_INLINE void SignedCodes(const uint8_t* c, __m512i* w) {
  if constexpr (Bits == kQ6K) {
    const __m512i nibble = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16), thirty_two = _mm512_set1_epi8(32);
    for (int j = 0; j < 4; ++j) {
      const __m512i raw = _mm512_loadu_si512(c + 64 * j);
      w[j] = _mm512_and_si512(raw, nibble);
      w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
    }
    for (int v = 0; v < 8; ++v) {  // + 16 where the fifth bit is set, - 32 where the sixth is not: q - 32
      uint64_t fifth, sixth;
      __builtin_memcpy(&fifth, c + kQ4BlockBytes + 8 * v, 8);
      __builtin_memcpy(&sixth, c + kQ6KSixthBits + 8 * v, 8);
      w[v] = _mm512_mask_add_epi8(w[v], fifth, w[v], sixteen);
      w[v] = _mm512_mask_sub_epi8(w[v], ~sixth, w[v], thirty_two);
    }
  } else {  // kQ3K, kQ2K: the 2-bit fields
    const __m512i two_bits = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    for (int j = 0; j < 2; ++j) {
      const __m512i raw = _mm512_loadu_si512(c + 64 * j);
      for (int p = 0; p < 4; ++p) w[j + 2 * p] = _mm512_and_si512(_mm512_srli_epi16(raw, 2 * p), two_bits);
    }
    if constexpr (Bits == kQ3K) {
      for (int v = 0; v < 8; ++v) {  // - 4 where the third bit is not set: q - 4
        uint64_t third;
        __builtin_memcpy(&third, c + kQ3KThirdBits + 8 * v, 8);
        w[v] = _mm512_mask_sub_epi8(w[v], ~third, w[v], four);
      }
    }
  }
}

// 128 * sum(s) over a half's 16 columns, a row each: what x + 128 adds to the half's dot products.
ALWAYS_INLINE __m512i HalfExcess(const __m512i* w) {
  const __m512i sum = _mm512_add_epi8(_mm512_add_epi8(w[0], w[1]), _mm512_add_epi8(w[2], w[3]));  // Q6K: -128..124
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), sum);
}

// The exact sum(x * s) over a half's 16 columns for the 16 rows of w[0..3]: (x + 128) . s, from -excess; MatMulQ2K's
// codes are unsigned already, so its x is as it is (AdaptRows leaves it) and its dot products start from 0.
template <int Bits>
ALWAYS_INLINE __m512i HalfDot(const __m512i* w, const int8_t* xu, __m512i minus_excess) {
  const auto dot = [&](__m512i acc, int q) {
    const __m512i x = _mm512_set1_epi32(Load32(xu + 4 * q));
    return kQSub16MinsOf<Bits> ? _mm512_dpbusd_epi32(acc, w[q], x) : _mm512_dpbusd_epi32(acc, x, w[q]);
  };
  const __m512i s0 = dot(dot(minus_excess, 0), 2), s1 = dot(dot(_mm512_setzero_si512(), 1), 3);
  return _mm512_add_epi32(s0, s1);
}

// A half's sc * d of the 16 rows at c, and (MatMulQ2K, whose bytes are sc | mn << 4) their mn * -dmin; the int8 sc of
// MatMulQ3K and Q6K.
template <int Bits>
ALWAYS_INLINE void SubSteps(const uint8_t* c, int h, __m512 d, __m512 minus_dmin, __m512& step, __m512& min) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + kQSubScalesOf<Bits> + kQGroup * h));
  if constexpr (kQSub16MinsOf<Bits>) {
    const __m512i both = _mm512_cvtepu8_epi32(bytes);
    step = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(both, _mm512_set1_epi32(0x0F))), d);
    min = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(both, 4)), minus_dmin);
  } else {
    step = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), d);
  }
}

template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRowsSub16(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                                  const float* xs, const float* hs, int64_t xs_stride, const float* bias, float* y,
                                  int64_t y_stride, int64_t KB, int64_t valid) {
  static_assert(!Pairs || MT % 2 == 0, "a pair is two rows");
  constexpr int kStep = Pairs ? 2 : 1, kOut = MT / kStep;
  __m512 acc[kOut];
  for (int o = 0; o < kOut; ++o) acc[o] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* c = codes + b * kQBlockBytesOf<Bits>;
    const S* sd = Sub16ScalesAt<Bits>(scales, b);
    PrefetchAhead<Bits>(c, sd);
    __m512i w[8];
    SignedCodes<Bits>(c, w);
    const __m512i zero = _mm512_setzero_si512();
    __m512i minus_lo = zero, minus_hi = zero;
    if constexpr (!kQSub16MinsOf<Bits>)
      minus_lo = _mm512_sub_epi32(zero, HalfExcess(w)), minus_hi = _mm512_sub_epi32(zero, HalfExcess(w + 4));
    const __m512 d = Load16(sd), minus_dmin = kQSub16MinsOf<Bits> ? Load16(sd + kQGroup) : d;
    __m512 step_lo, step_hi, min_lo = d, min_hi = d;  // min: MatMulQ2K's -dmin * mn
    SubSteps<Bits>(c, 0, d, minus_dmin, step_lo, min_lo);
    SubSteps<Bits>(c, 1, d, minus_dmin, step_hi, min_hi);
    for (int o = 0; o < kOut; ++o) {
      const int64_t i = o * kStep;
      const int8_t* xu = xq + i * xq_stride + b * kQBlock;  // x + 128 (kSub16UnsignedRows; MatMulQ2K: x)
      __m512i lo = HalfDot<Bits>(w, xu, minus_lo), hi = HalfDot<Bits>(w + 4, xu + 16, minus_hi);
      if constexpr (Pairs) {  // the residual row, 256 times finer, added as integers (256 * 16 * 127 * 32 < 2^31)
        lo = _mm512_add_epi32(_mm512_slli_epi32(lo, kResidualShift), HalfDot<Bits>(w, xu + xq_stride, minus_lo));
        hi = _mm512_add_epi32(_mm512_slli_epi32(hi, kResidualShift), HalfDot<Bits>(w + 4, xu + xq_stride + 16, minus_hi));
      }
      const __m512 both = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), step_lo, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), step_hi));
      const float dx = xs[i * xs_stride + 2 * b + (Pairs ? xs_stride : 0)];  // Pairs: the residual's, dx / 256
      acc[o] = _mm512_fmadd_ps(both, _mm512_set1_ps(dx), acc[o]);
      if constexpr (kQSub16MinsOf<Bits>) {
        float lo_sum, hi_sum;
        HalvesOf<Pairs>(hs, xs_stride, i, b, lo_sum, hi_sum);
        acc[o] = _mm512_fmadd_ps(min_lo, _mm512_set1_ps(lo_sum), _mm512_fmadd_ps(min_hi, _mm512_set1_ps(hi_sum), acc[o]));
      }
    }
  }
  const __mmask16 mask = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
  const __m512 add = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int o = 0; o < kOut; ++o) _mm512_mask_storeu_ps(y + o * y_stride, mask, _mm512_add_ps(acc[o], add));
}

#elif defined(__AVX2__)

constexpr bool kSub16UnsignedRows = false;

// 0xFF in byte i where bit i of ``bits`` is set (FifthBits without its final mask).
ALWAYS_INLINE __m256i BitBytes(uint32_t bits) {
  const __m256i byte_of_bit = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bit_of_byte = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)), byte_of_bit);
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
}

// Vector v's codes for rows 8h..8h+7 as signed bytes (columns 4v..4v+3). Q6K: the nibble, + 16 where the fifth
// bit is set, - 32 where the sixth is not; Q3K: the 2-bit field, - 4 where the third bit is not set; Q2K: the
// 2-bit field.
template <int Bits>
ALWAYS_INLINE __m256i SignedCodes(const uint8_t* c, int v, int64_t h) {
  if constexpr (Bits == kQ3K || Bits == kQ2K) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * (v % 2) + 32 * h));
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * (v / 2)), _mm256_set1_epi8(3));
    if constexpr (Bits == kQ2K) return low;
    uint32_t third;
    __builtin_memcpy(&third, c + kQ3KThirdBits + 8 * v + 4 * h, 4);
    return _mm256_add_epi8(low, _mm256_andnot_si256(BitBytes(third), _mm256_set1_epi8(-4)));
  }
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * (v % 4) + 32 * h));
  const __m256i low = _mm256_and_si256(_mm256_srli_epi16(raw, 4 * (v / 4)), _mm256_set1_epi8(0x0F));
  uint32_t fifth, sixth;
  __builtin_memcpy(&fifth, c + kQ4BlockBytes + 8 * v + 4 * h, 4);
  __builtin_memcpy(&sixth, c + kQ6KSixthBits + 8 * v + 4 * h, 4);
  const __m256i plus = _mm256_and_si256(BitBytes(fifth), _mm256_set1_epi8(16));
  const __m256i minus = _mm256_andnot_si256(BitBytes(sixth), _mm256_set1_epi8(-32));
  return _mm256_add_epi8(low, _mm256_add_epi8(plus, minus));
}

// sc * d of rows 8h..8h+7 for the block's half `half` (MatMulQ2K, nibble 1: mn * -dmin).
template <int Bits, typename S>
ALWAYS_INLINE __m256 SubStep(const uint8_t* c, const S* sd, int64_t h, int half, int nibble = 0) {
  __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + kQSubScalesOf<Bits> + kQGroup * half + 8 * h));
  if constexpr (kQSub16MinsOf<Bits>) bytes = _mm_and_si128(_mm_srli_epi16(bytes, 4 * nibble), _mm_set1_epi8(0x0F));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), Load8(sd + kQGroup * nibble + 8 * h));
}

// 16-bit activations: pairs [0, MT / 2) of QuantizePairAt's int16 codes against the group, a column half at a
// time (sums a pair and row half: 16 * 32 * 32639 < 2^31).
template <int Bits, typename S, int MT>
ALWAYS_INLINE void GroupPairsSub16(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                                   const float* xs, const float* hs, int64_t xs_stride, const float* bias, float* y,
                                   int64_t y_stride, int64_t KB, int64_t valid) {
  constexpr int kOut = MT / 2;
  __m256 acc[kOut][2];
  for (int o = 0; o < kOut; ++o) acc[o][0] = acc[o][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* c = codes + b * kQBlockBytesOf<Bits>;
    const S* sd = Sub16ScalesAt<Bits>(scales, b);
    PrefetchAhead<Bits>(c, sd);
    const int8_t* xb = xq + 2 * kQBlock * b;
    for (int half = 0; half < 2; ++half) {
      __m256i sums[kOut][2];
      for (int o = 0; o < kOut; ++o) sums[o][0] = sums[o][1] = _mm256_setzero_si256();
      for (int v = 4 * half; v < 4 * half + 4; ++v) {
        const __m256i s0 = SignedCodes<Bits>(c, v, 0), s1 = SignedCodes<Bits>(c, v, 1);
        for (int k = 0; k < 2; ++k) {  // k = 0: columns (4v, 4v + 2), bytes 0 and 2 of a lane; k = 1: 1 and 3
          const __m256i w0 = _mm256_srai_epi16(k ? s0 : _mm256_slli_epi16(s0, 8), 8);
          const __m256i w1 = _mm256_srai_epi16(k ? s1 : _mm256_slli_epi16(s1, 8), 8);
          const int dword = PairDword(half, v % 4, k);
          for (int o = 0; o < kOut; ++o) {
            const __m256i x = _mm256_set1_epi32(Load32(xb + 2 * o * xq_stride + 4 * dword));
            sums[o][0] = _mm256_add_epi32(sums[o][0], _mm256_madd_epi16(w0, x));
            sums[o][1] = _mm256_add_epi32(sums[o][1], _mm256_madd_epi16(w1, x));
          }
        }
      }
      for (int h = 0; h < 2; ++h) {
        const __m256 step = SubStep<Bits>(c, sd, h, half);
        for (int o = 0; o < kOut; ++o) {
          const __m256 dx = _mm256_set1_ps(xs[2 * o * xs_stride + xs_stride + 2 * b]);  // the pair's dx / 256
          acc[o][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[o][h]), _mm256_mul_ps(step, dx), acc[o][h]);
        }
        if constexpr (kQSub16MinsOf<Bits>) {
          const __m256 min = SubStep<Bits>(c, sd, h, half, 1);
          for (int o = 0; o < kOut; ++o) {
            float halves[2];
            HalvesOf<true>(hs, xs_stride, 2 * o, b, halves[0], halves[1]);
            acc[o][h] = _mm256_fmadd_ps(min, _mm256_set1_ps(halves[half]), acc[o][h]);
          }
        }
      }
    }
  }
  for (int64_t h = 0; h < 2 && 8 * h < valid; ++h)
    for (int o = 0; o < kOut; ++o) StoreHalf(acc[o][h], h, valid, bias, y + o * y_stride);
}

template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRowsSub16(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                                  const float* xs, const float* hs, int64_t xs_stride, const float* bias, float* y,
                                  int64_t y_stride, int64_t KB, int64_t valid) {
  if constexpr (Pairs) {
    return GroupPairsSub16<Bits, S, MT>(codes, scales, xq, xq_stride, xs, hs, xs_stride, bias, y, y_stride, KB, valid);
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t h = 0; h < 2 && 8 * h < valid; ++h) {
    __m256 acc[MT];
    for (int o = 0; o < MT; ++o) acc[o] = _mm256_setzero_ps();
    for (int64_t b = 0; b < KB; ++b) {
      const uint8_t* c = codes + b * kQBlockBytesOf<Bits>;
      const S* sd = Sub16ScalesAt<Bits>(scales, b);
      if (h == 0) PrefetchAhead<Bits>(c, sd);
      __m256i w[8], size[8];  // the signed codes, and their magnitudes for vpmaddubsw
      for (int v = 0; v < 8; ++v) w[v] = SignedCodes<Bits>(c, v, h), size[v] = _mm256_abs_epi8(w[v]);
      const __m256 step_lo = SubStep<Bits>(c, sd, h, 0), step_hi = SubStep<Bits>(c, sd, h, 1);
      __m256 min_lo = step_lo, min_hi = step_hi;  // MatMulQ2K's -dmin * mn
      if constexpr (kQSub16MinsOf<Bits>) min_lo = SubStep<Bits>(c, sd, h, 0, 1), min_hi = SubStep<Bits>(c, sd, h, 1, 1);
      for (int o = 0; o < MT; ++o) {
        const int8_t* xb = xq + o * xq_stride + b * kQBlock;
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        for (int v = 0; v < 4; ++v) {
          lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(size[v], _mm256_sign_epi8(_mm256_set1_epi32(Load32(xb + 4 * v)), w[v])));
          hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(size[v + 4], _mm256_sign_epi8(_mm256_set1_epi32(Load32(xb + 16 + 4 * v)), w[v + 4])));
        }
        const __m256 dx = _mm256_set1_ps(xs[o * xs_stride + 2 * b]);
        acc[o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(lo, ones)), _mm256_mul_ps(step_lo, dx), acc[o]);
        acc[o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(hi, ones)), _mm256_mul_ps(step_hi, dx), acc[o]);
        if constexpr (kQSub16MinsOf<Bits>) {
          float lo_sum, hi_sum;
          HalvesOf<false>(hs, xs_stride, o, b, lo_sum, hi_sum);
          acc[o] = _mm256_fmadd_ps(min_lo, _mm256_set1_ps(lo_sum), _mm256_fmadd_ps(min_hi, _mm256_set1_ps(hi_sum), acc[o]));
        }
      }
    }
    for (int o = 0; o < MT; ++o) StoreHalf(acc[o], h, valid, bias, y + o * y_stride);
  }
}

#else

constexpr bool kSub16UnsignedRows = false;

// The code of row r and column 4v + j of the block at c (Q6K: 6 bits, Q3K: 3, Q2K: 2).
template <int Bits>
ALWAYS_INLINE int32_t Sub16Code(const uint8_t* c, int64_t r, int64_t v, int64_t j) {
  const int64_t lane = 4 * r + j;
  if constexpr (Bits == kQ3K || Bits == kQ2K) {
    const int32_t low = (c[64 * (v % 2) + lane] >> (2 * (v / 2))) & 3;
    if constexpr (Bits == kQ2K) return low;
    return low | ((c[kQ3KThirdBits + 8 * v + lane / 8] >> (lane % 8)) & 1) << 2;
  }
  const uint8_t byte = c[64 * (v % 4) + lane];
  const int32_t low = v < 4 ? byte & 0x0F : byte >> 4;
  const int32_t fifth = (c[kQ4BlockBytes + 8 * v + lane / 8] >> (lane % 8)) & 1;
  const int32_t sixth = (c[kQ6KSixthBits + 8 * v + lane / 8] >> (lane % 8)) & 1;
  return low | fifth << 4 | sixth << 5;
}

template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRowsSub16(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                                  const float* xs, const float* hs, int64_t xs_stride, const float* bias, float* y,
                                  int64_t y_stride, int64_t KB, int64_t valid) {
  for (int64_t r = 0; r < valid; ++r) {
    float acc[MT] = {};
    for (int i = 0; i < MT; ++i)
      for (int64_t b = 0; b < KB; ++b) {
        const uint8_t* c = codes + b * kQBlockBytesOf<Bits>;
        const S* sd = Sub16ScalesAt<Bits>(scales, b) + r;
        const int8_t* xb = xq + i * xq_stride + b * kQBlock;
        for (int64_t half = 0; half < 2; ++half) {
          int32_t dot = 0;
          for (int64_t v = 4 * half; v < 4 * half + 4; ++v)
            for (int64_t j = 0; j < 4; ++j) dot += (Sub16Code<Bits>(c, r, v, j) - kQMiddleOf<Bits>) * xb[4 * v + j];
          const uint8_t byte = c[kQSubScalesOf<Bits> + kQGroup * half + r];
          const float sub = static_cast<float>(kQSub16MinsOf<Bits> ? byte & 0x0F : static_cast<int8_t>(byte));
          acc[i] += static_cast<float>(dot) * (sub * Scale(sd) * xs[i * xs_stride + 2 * b]);
          if constexpr (kQSub16MinsOf<Bits>)  // -dmin * mn times this row's dx * sum(xq) over the half
            acc[i] += Scale(sd + kQGroup) * static_cast<float>(byte >> 4) * hs[i * xs_stride + 2 * b + half];
        }
      }
    const float add = bias ? bias[r] : 0.f;
    if constexpr (Pairs) {
      for (int i = 0; i + 1 < MT; i += 2) y[i / 2 * y_stride + r] = acc[i] + acc[i + 1] + add;
    } else {
      for (int i = 0; i < MT; ++i) y[i * y_stride + r] = acc[i] + add;
    }
  }
}

#endif
