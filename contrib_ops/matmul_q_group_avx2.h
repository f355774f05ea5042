// MatMulQ's group kernel for AVX2 (see matmul_q_kernel.cc): kTileRows, BlockAmax, QuantizeAt,
// QuantizePairAt and GroupRows (vpmaddubsw + vpmaddwd on 4-bit halves; 8-bit codes against 16-bit
// pairs in vpmaddwd). Included INSIDE matmul_q_kernel.cc's ISA namespace, after its shared helpers;
// no includes of its own.

constexpr int kTileRows = 8;

ALWAYS_INLINE float HorizontalMax(__m256 v) {
  __m128 r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)));
}

ALWAYS_INLINE int32_t HorizontalSum(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32(r, 0xB1)));
}

ALWAYS_INLINE float BlockAmax(const float* in) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 a = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(in + 8 * j)));
  return HorizontalMax(a);
}

// Codes of 8 values, clamped to +-127 (one int32 lane each).
ALWAYS_INLINE __m256i Codes8(__m256 scaled) {
  const __m256i q = _mm256_cvtps_epi32(scaled);
  return _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
}

// A block's 32 codes as int8 into out; returns their sum.
ALWAYS_INLINE int32_t Store32(const __m256i* q, int8_t* out) {
  // int32 -> int8; the two packs interleave 128-bit lanes, the permute restores order
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
  return HorizontalSum(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
}

ALWAYS_INLINE int32_t QuantizeAt(const float* in, float inverse, int8_t* out) {
  const __m256 id = _mm256_set1_ps(inverse);
  __m256i q[4];
  for (int j = 0; j < 4; ++j) q[j] = Codes8(_mm256_mul_ps(_mm256_loadu_ps(in + 8 * j), id));
  return Store32(q, out);
}

// QuantizeAt, and in the same pass the codes of what it misses, x - dx * q rounded once, on the grid
// kResidualSteps times finer (into fine_out; sums: both code sums).
ALWAYS_INLINE void QuantizePairAt(const float* in, float inverse, float dx, int8_t* out, int8_t* fine_out,
                                  int32_t* sums) {
  const __m256 id = _mm256_set1_ps(inverse), fine = _mm256_set1_ps(inverse * kResidualSteps);
  const __m256 step = _mm256_set1_ps(dx);
  __m256i q[4], r[4];
  for (int j = 0; j < 4; ++j) {
    const __m256 x = _mm256_loadu_ps(in + 8 * j);
    q[j] = Codes8(_mm256_mul_ps(x, id));
    r[j] = Codes8(_mm256_mul_ps(_mm256_fnmadd_ps(step, _mm256_cvtepi32_ps(q[j]), x), fine));
  }
  sums[0] = Store32(q, out);
  sums[1] = Store32(r, fine_out);
}

template <typename S>
ALWAYS_INLINE __m256 Load8(const S* p) {
  if constexpr (sizeof(S) == 2) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  else return _mm256_loadu_ps(p);
}

// Bytes 0 or 16: byte i is bit i of ``bits``, as bit 4 (a 5-bit code's fifth bit).
ALWAYS_INLINE __m256i FifthBits(uint32_t bits) {
  const __m256i byte_of_bit = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bit_of_byte = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)), byte_of_bit);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// As the AVX-512 build, one half of the group (8 rows) at a time. vpmaddubsw's int16 pair sums stay
// below 2^15 when the codes are 4-bit: 8 of them add at most 16 * 15 * 127 = 30480; 5-bit codes (the
// nibbles with their fifth bits OR-ed in) go in two sums of 4 each, at most 8 * 31 * 127 = 31496.
// 8-bit codes are taken as two 4-bit halves, hi * 16 + lo, each summed apart; with 16-bit activations
// they meet the activations' 16-bit codes in vpmaddwd instead (WideDot), one pass for the pair.
// A block's codes are unpacked once, then each row of x streams past them in two short chains of
// int16 sums: 4- and 5-bit codes as 8 vectors that stay in registers, 8-bit codes as 16 vectors of
// nibbles that do not fit and are read back from L1 (GCC had scheduled the older loops, which kept
// a pair of sums per row instead, into hundreds of stack spills). The int16 sums become int32 in
// vpmaddwd against ``unit``: 1, or 256 for the first row of a pair.
template <int Bits>
ALWAYS_INLINE __m256i BlockDot(const __m256i* w, const int8_t* xb, __m256i unit) {
  __m256i s0 = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(Load32(xb)));
  __m256i s1 = _mm256_maddubs_epi16(w[4], _mm256_set1_epi32(Load32(xb + 16)));
  for (int q = 1; q < 4; ++q) {
    s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(w[q], _mm256_set1_epi32(Load32(xb + 4 * q))));
    s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(w[q + 4], _mm256_set1_epi32(Load32(xb + 16 + 4 * q))));
  }
  if constexpr (Bits == 4) return _mm256_madd_epi16(_mm256_add_epi16(s0, s1), unit);
  return _mm256_add_epi32(_mm256_madd_epi16(s0, unit), _mm256_madd_epi16(s1, unit));
}

// 8-bit codes against a pair's 16-bit activation codes 256 * hi + lo (|.| <= 32639, so a block's sums
// stay below 32 * 255 * 32639 < 2^31). wide[p]: the half's 8 rows x columns 2p, 2p + 1 as int16, a
// row a 32-bit lane (WideCodes), so vpmaddwd against a broadcast column pair leaves each row's sum in
// its own lane. The pair's codes go through memory on purpose: a broadcast from memory is a load,
// where GCC's broadcasts from a register took a shuffle each, on the port that vpshufb needs too.
ALWAYS_INLINE void WideCodes(const uint8_t* c, __m256i* wide) {
  // vpshufb picks bytes within 16-byte lanes; 0x80 (and 0x80 + the lane's offset) writes a zero
  const __m256i lane = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C);
  const __m256i lo = _mm256_add_epi8(_mm256_set1_epi32(static_cast<int32_t>(0x80018000u)), lane);  // bytes 0, 1
  const __m256i hi = _mm256_add_epi8(_mm256_set1_epi32(static_cast<int32_t>(0x80038002u)), lane);  // bytes 2, 3
  for (int q = 0; q < 8; ++q) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * q));
    wide[2 * q] = _mm256_shuffle_epi8(raw, lo), wide[2 * q + 1] = _mm256_shuffle_epi8(raw, hi);
  }
}

ALWAYS_INLINE __m256i WideDot(const __m256i* wide, const int8_t* hi, const int8_t* lo) {
  alignas(32) int16_t x[kQBlock];
  for (int j = 0; j < 2; ++j) {
    const auto load = [&](const int8_t* p) {
      return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j)));
    };
    const __m256i code = _mm256_add_epi16(_mm256_slli_epi16(load(hi), kResidualShift), load(lo));
    _mm256_store_si256(reinterpret_cast<__m256i*>(x + 16 * j), code);
  }
  __asm__ volatile("" : : "r"(x) : "memory");  // keep the broadcasts below as loads
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
  const int8_t* pairs = reinterpret_cast<const int8_t*>(x);  // column pair p: bytes 4p..4p+3
  for (int p = 0; p < 16; p += 2) {
    even = _mm256_add_epi32(even, _mm256_madd_epi16(wide[p], _mm256_set1_epi32(Load32(pairs + 4 * p))));
    odd = _mm256_add_epi32(odd, _mm256_madd_epi16(wide[p + 1], _mm256_set1_epi32(Load32(pairs + 4 * p + 4))));
  }
  return _mm256_add_epi32(even, odd);
}

// Rows [0, MT) of x against one group, as the AVX-512 build's (Pairs: y[i / 2] from rows i and i + 1).
template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRows(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                             const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                             int64_t KB, int64_t valid) {
  static_assert(!Pairs || MT % 2 == 0, "a pair is two rows");
  constexpr int kStep = Pairs ? 2 : 1, kOut = MT / kStep;
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
  const __m256i coarse = _mm256_set1_epi16(1 << kResidualShift);
  for (int64_t h = 0; h < 2 && 8 * h < valid; ++h) {
    __m256 acc[kOut];
    for (int o = 0; o < kOut; ++o) acc[o] = _mm256_setzero_ps();
    for (int64_t b = 0; b < KB; ++b) {
      const uint8_t* c = codes + b * BlockBytes(Bits) + 32 * h;
      if (h == 0) PrefetchAhead<Bits>(c, scales + b * 2 * kQGroup);  // the second half finds them in cache
      const int8_t* xb = xq + b * kQBlock;
      __m256i sums[kOut];
      if constexpr (Bits != 8) {
        __m256i w[8];  // w[q]: 8 rows x columns 4q..4q+3 of the block
        for (int j = 0; j < 4; ++j) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j));
          w[j] = _mm256_and_si256(raw, nibble), w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
        }
        if constexpr (Bits == 5) {
          const uint8_t* fifth = codes + b * BlockBytes(Bits) + kQ4BlockBytes + 4 * h;
          for (int q = 0; q < 8; ++q) {
            uint32_t bits;
            __builtin_memcpy(&bits, fifth + 8 * q, 4);
            w[q] = _mm256_or_si256(w[q], FifthBits(bits));
          }
        }
        for (int o = 0; o < kOut; ++o) {
          const int8_t* row = xb + o * kStep * xq_stride;
          if constexpr (Pairs)
            sums[o] = _mm256_add_epi32(BlockDot<Bits>(w, row, coarse), BlockDot<Bits>(w, row + xq_stride, ones));
          else
            sums[o] = BlockDot<Bits>(w, row, ones);
        }
      } else if constexpr (Pairs) {
        __m256i wide[16];
        WideCodes(c, wide);
        for (int o = 0; o < kOut; ++o) sums[o] = WideDot(wide, xb + 2 * o * xq_stride, xb + (2 * o + 1) * xq_stride);
      } else {
        __m256i halves[16];  // [2j]: low nibbles of vector j (columns 4j..4j+3), [2j + 1]: high nibbles
        for (int j = 0; j < 8; ++j) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j));
          halves[2 * j] = _mm256_and_si256(raw, nibble);
          halves[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
        }
        for (int o = 0; o < kOut; ++o) {  // two int16 chains a row: the low and the high nibbles' sums
          const int8_t* row = xb + o * xq_stride;
          __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
          for (int j = 0; j < 8; ++j) {
            const __m256i x = _mm256_set1_epi32(Load32(row + 4 * j));
            low = _mm256_add_epi16(low, _mm256_maddubs_epi16(halves[2 * j], x));
            high = _mm256_add_epi16(high, _mm256_maddubs_epi16(halves[2 * j + 1], x));
          }
          sums[o] = _mm256_add_epi32(_mm256_madd_epi16(low, ones), _mm256_madd_epi16(high, sixteen));
        }
      }
      const S* sb = scales + b * 2 * kQGroup + 8 * h;
      const __m256 d = Load8(sb), m = Load8(sb + kQGroup);
      for (int o = 0; o < kOut; ++o) {
        const float* sc = xs + o * kStep * xs_stride + 2 * b;
        float dx = sc[0], sum = sc[1];
        if constexpr (Pairs) dx = sc[xs_stride], sum += sc[xs_stride + 1];  // the residual's scale: dx / 256
        acc[o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[o]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[o]);
        acc[o] = _mm256_fmadd_ps(m, _mm256_set1_ps(sum), acc[o]);
      }
    }
    const int64_t n = MinI(8, valid - 8 * h);
    for (int o = 0; o < kOut; ++o) {
      float out[8];
      _mm256_storeu_ps(out, acc[o]);
      float* row = y + o * y_stride + 8 * h;
      for (int64_t r = 0; r < n; ++r) row[r] = out[r] + (bias ? bias[8 * h + r] : 0.f);
    }
  }
}
