// MatMulQ's group kernel for AVX2 (see matmul_q_kernel.cc): kTileRows, kRowsOuter, BlockAmax, QuantizeAt,
// QuantizePairAt, GroupRows (8-bit activations: vpmaddubsw + vpmaddwd on 4-bit halves; 16-bit
// activations: int16 codes against codes widened to int16 in vpmaddwd) and GroupPairsWidenedOnce
// (16-bit activations, several tiles of rows: each block's codes widened once for all of them).
// Included INSIDE matmul_q_kernel.cc's ISA namespace, after its shared helpers; no includes of its own.

constexpr int kTileRows = 8;
constexpr bool kRowsOuter = false;  // groups outer, as the widened tiles need

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

// The sums of a block's halves of codes q[0..3] (8 columns each): columns 0..15, then 16..31.
ALWAYS_INLINE void HalfSums(const __m256i* q, int32_t* halves) {
  halves[0] = HorizontalSum(_mm256_add_epi32(q[0], q[1]));
  halves[1] = HorizontalSum(_mm256_add_epi32(q[2], q[3]));
}

// A block's 32 codes as int8 into out, the sums of its halves into halves.
ALWAYS_INLINE void Store32(const __m256i* q, int8_t* out, int32_t* halves) {
  // int32 -> int8; the two packs interleave 128-bit lanes, the permute restores order
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
  HalfSums(q, halves);
}

ALWAYS_INLINE void QuantizeAt(const float* in, float inverse, int8_t* out, int32_t* halves) {
  const __m256 id = _mm256_set1_ps(inverse);
  __m256i q[4];
  for (int j = 0; j < 4; ++j) q[j] = Codes8(_mm256_mul_ps(_mm256_loadu_ps(in + 8 * j), id));
  Store32(q, out, halves);
}

// 16-bit activations (a pair of int8 rows, see matmul_q_kernel.h) are kept on AVX2 as one int16 code
// a value, 256 * q + r (|.| <= 32639), in the pair's 2 x 32 bytes a block: the kernel multiplies them
// with vpmaddwd against codes widened to int16, one pass where int8 needed two. The codes are
// stored in the order of the int16 column pairs that masking a code vector yields (PairDot): per
// block, dword 8 * half + 2 * place(c) + k holds the columns (16 * half + 4c + k, 16 * half + 4c + k
// + 2), with place(c) = 0, 2, 1, 3 for c = 0..3 (the order vpackssdw leaves them in).
ALWAYS_INLINE int PairDword(int half, int c, int k) { return 8 * half + 2 * ((c & 1) * 2 + (c >> 1)) + k; }

// QuantizeAt, and in the same pass the codes of what it misses, x - dx * q rounded once, on the grid
// kResidualSteps times finer, stored as 256 * q + r at block b of the pair's row (sums: both code sums).
ALWAYS_INLINE void QuantizePairAt(const float* in, float inverse, float dx, int8_t* pair, int64_t /*KB*/,
                                  int64_t b, int32_t* sums) {
  const __m256 id = _mm256_set1_ps(inverse), fine = _mm256_set1_ps(inverse * kResidualSteps);
  const __m256 step = _mm256_set1_ps(dx);
  __m256i q[4], r[4], code[4];
  for (int j = 0; j < 4; ++j) {
    const __m256 x = _mm256_loadu_ps(in + 8 * j);
    q[j] = Codes8(_mm256_mul_ps(x, id));
    r[j] = Codes8(_mm256_mul_ps(_mm256_fnmadd_ps(step, _mm256_cvtepi32_ps(q[j]), x), fine));
    code[j] = _mm256_add_epi32(_mm256_slli_epi32(q[j], kResidualShift), r[j]);
  }
  // vpackssdw leaves columns 4c..4c+3 of the two inputs in the order c = 0, 2, 1, 3 (128-bit lanes);
  // the shuffle orders each 4 as 0, 2, 1, 3
  const __m256i pairs = _mm256_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15,
                                         0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
  for (int half = 0; half < 2; ++half) {
    const __m256i packed = _mm256_packs_epi32(code[2 * half], code[2 * half + 1]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pair + 2 * kQBlock * b + 32 * half), _mm256_shuffle_epi8(packed, pairs));
  }
  HalfSums(q, sums);
  HalfSums(r, sums + 2);
}

// Outputs 8h..8h+7 of a group's row (those below `valid`): a vector of 8 sums, plus the bias.
ALWAYS_INLINE void StoreHalf(__m256 sums, int64_t h, int64_t valid, const float* bias, float* row) {
  float out[8];
  _mm256_storeu_ps(out, sums);
  const int64_t n = MinI(8, valid - 8 * h);
  for (int64_t r = 0; r < n; ++r) row[8 * h + r] = out[r] + (bias ? bias[8 * h + r] : 0.f);
}

template <typename S>
ALWAYS_INLINE __m256 Load8(const S* p) {
  if constexpr (sizeof(S) == 2) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  else return _mm256_loadu_ps(p);
}

// Rows 8h..8h+7 of block b's d and m: as stored, -middle * d (centred), or (MatMulQ4K / Q5K) the super-block's d
// and -dmin times the block's u8 sub-scales and mins, which follow its codes at c (MatMulQ4XS: d times its int8
// sub-scales, then centred).
template <int Bits, typename S>
ALWAYS_INLINE void BlockDM(const uint8_t* c, const S* scales, int64_t b, int64_t h, __m256& d, __m256& m) {
  const S* s = BlockScalesAt<Bits>(scales, b) + 8 * h;
  d = Load8(s);
  if constexpr (kQCentredOf<Bits>) {
    if constexpr (kQSuperBlockDMOf<Bits>) {  // MatMulQ4XS: times the block's int8 sub-scales
      const __m128i sub = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + kQCodeBytesOf<Bits> + 8 * h));
      d = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sub)));
    }
    m = _mm256_mul_ps(d, _mm256_set1_ps(-kQMiddleOf<Bits>));
    return;
  }
  m = Load8(s + kQGroup);
  if constexpr (kQSuperBlockDMOf<Bits>) {
    const auto bytes = [&](int64_t at) {
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + at))));
    };
    const int64_t at = kQCodeBytesOf<Bits> + 8 * h;
    d = _mm256_mul_ps(d, bytes(at));
    m = _mm256_mul_ps(m, bytes(at + kQGroup));
  }
}

// Bytes 0 or 16: byte i is bit i of ``bits``, as bit 4 (a 5-bit code's fifth bit).
ALWAYS_INLINE __m256i FifthBits(uint32_t bits) {
  const __m256i byte_of_bit = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bit_of_byte = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)), byte_of_bit);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// 8-bit activations, as the AVX-512 build, one half of the group (8 rows) at a time. vpmaddubsw's int16
// pair sums stay below 2^15 when the codes are 4-bit: 8 of them add at most 16 * 15 * 127 = 30480;
// 5-bit codes (the nibbles with their fifth bits OR-ed in) go in two sums of 4 each, at most
// 8 * 31 * 127 = 31496. 8-bit codes (Q8's, Q4NL's after the lookup) are taken as two 4-bit halves,
// hi * 16 + lo, each summed apart.
// A block's codes are unpacked once, then each row of x streams past them in two short chains of
// int16 sums: 4- and 5-bit codes as 8 vectors that stay in registers, 8-bit codes as 16 vectors of
// nibbles that do not fit and are read back from L1 (GCC had scheduled the older loops, which kept
// a pair of sums per row instead, into hundreds of stack spills). The int16 sums become int32 in
// vpmaddwd against ones.
template <int Bits>
ALWAYS_INLINE __m256i BlockDot(const __m256i* w, const int8_t* xb, __m256i ones) {
  __m256i s0 = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(Load32(xb)));
  __m256i s1 = _mm256_maddubs_epi16(w[4], _mm256_set1_epi32(Load32(xb + 16)));
  for (int q = 1; q < 4; ++q) {
    s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(w[q], _mm256_set1_epi32(Load32(xb + 4 * q))));
    s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(w[q + 4], _mm256_set1_epi32(Load32(xb + 16 + 4 * q))));
  }
  if constexpr (Bits == 4) return _mm256_madd_epi16(_mm256_add_epi16(s0, s1), ones);
  return _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones));
}

// 5-bit codes: vector v's nibbles (low or high, as v / 4) with their fifth bits, a byte each, per half.
ALWAYS_INLINE void FifthNibbles(const uint8_t* c, int v, __m256i* five) {
  for (int h = 0; h < 2; ++h) {
    uint32_t bits;
    __builtin_memcpy(&bits, c + kQ4BlockBytes + 8 * v + 4 * h, 4);
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * (v % 4) + 32 * h));
    const __m256i nibbles = _mm256_srli_epi16(raw, 4 * (v / 4));
    five[h] = _mm256_or_si256(_mm256_and_si256(nibbles, _mm256_set1_epi8(0x0F)), FifthBits(bits));
  }
}

// Q4NL's table of 8-bit codes in both 128-bit lanes, for vpshufb by index nibbles.
ALWAYS_INLINE __m256i Q4NLTable() {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kQ4NLCodes)));
}

// Q4NL: vector v's 8-bit codes, looked up from its index nibbles (low or high, as v / 4), per half.
ALWAYS_INLINE void Q4NLBytes(const uint8_t* c, int v, __m256i* codes) {
  for (int h = 0; h < 2; ++h) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * (v % 4) + 32 * h));
    const __m256i indices = _mm256_and_si256(_mm256_srli_epi16(raw, 4 * (v / 4)), _mm256_set1_epi8(0x0F));
    codes[h] = _mm256_shuffle_epi8(Q4NLTable(), indices);
  }
}

// The codes of vector v as one byte each, per half, where they are not a plain load (5-bit and Q4NL codes).
template <int Bits>
ALWAYS_INLINE void VectorBytes(const uint8_t* c, int v, __m256i* bytes) {
  if constexpr (Bits == 5) FifthNibbles(c, v, bytes);
  if constexpr (Bits == kQ4NL) Q4NLBytes(c, v, bytes);
}

// The 8-bit codes (Q8's, or Q4NL's looked up) of a block's half at c as 16 vectors of nibbles: [2j] the low
// nibbles of columns 4j..4j+3, [2j + 1] the high ones.
template <int Bits>
ALWAYS_INLINE void CodeNibbles(const uint8_t* c, __m256i* halves) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < (Bits == kQ4NL ? 4 : 8); ++j) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j));
    if constexpr (Bits == kQ4NL) {  // vector j's indices in the low nibbles, vector j + 4's in the high ones
      const __m256i table = Q4NLTable();  // the codes' nibbles, each looked up directly
      const __m256i low = _mm256_and_si256(table, nibble), high = _mm256_and_si256(_mm256_srli_epi16(table, 4), nibble);
      for (int n = 0; n < 2; ++n) {
        const __m256i indices = _mm256_and_si256(n ? _mm256_srli_epi16(raw, 4) : raw, nibble);
        halves[2 * (j + 4 * n)] = _mm256_shuffle_epi8(low, indices);
        halves[2 * (j + 4 * n) + 1] = _mm256_shuffle_epi8(high, indices);
      }
    } else {
      halves[2 * j] = _mm256_and_si256(raw, nibble);
      halves[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
    }
  }
}

// The codes of columns 4v..4v+3 of a block's half h (rows 8h..8h+7 of the group) widened to int16 column
// pairs: k = 0 gives columns (4v, 4v + 2), k = 1 (4v + 1, 4v + 3); 4- and 5-bit codes from a nibble
// vector (shifts 0 and 8 for the low nibbles, 4 and 12 for the high ones), 8-bit codes from a byte
// vector (shifts 0 and 8). bytes: VectorBytes of v (5-bit and Q4NL codes only), as 8-bit codes.
template <int Bits>
ALWAYS_INLINE __m256i Widened(const uint8_t* c, int v, int k, int h, const __m256i* bytes) {
  if constexpr (Bits == 5 || Bits == kQ4NL) {
    return _mm256_and_si256(k ? _mm256_srli_epi32(bytes[h], 8) : bytes[h], _mm256_set1_epi32(0x00FF00FF));
  } else {
    const int vector = Bits == 8 ? v : v % 4, shift = (Bits == 8 ? 0 : 4 * (v / 4)) + 8 * k;
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * vector + 32 * h));
    return _mm256_and_si256(shift ? _mm256_srli_epi32(raw, shift) : raw,
                            _mm256_set1_epi32(Bits == 8 ? 0x00FF00FF : 0x000F000F));
  }
}

// One group against pairs [0, MT / 2) of 16-bit activations (QuantizePairAt's int16 codes): the codes
// of both halves are widened to int16 column pairs (Widened), and each broadcast of a pair's two int16
// codes meets both halves in vpmaddwd, int32 sums a row and half (at most 32 * 255 * 32639 < 2^31).
template <int Bits, typename S, int MT>
ALWAYS_INLINE void GroupPairs(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                              const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                              int64_t KB, int64_t valid) {
  constexpr int kOut = MT / 2;
  __m256 acc[kOut][2];
  for (int o = 0; o < kOut; ++o) acc[o][0] = acc[o][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* c = codes + b * kQBlockBytesOf<Bits>;
    PrefetchAhead<Bits>(c, BlockScalesAt<Bits>(scales, b));
    const int8_t* xb = xq + 2 * kQBlock * b;
    __m256i sums[kOut][2];
    for (int o = 0; o < kOut; ++o) sums[o][0] = sums[o][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) {
      __m256i bytes[2];
      VectorBytes<kQCodeOf<Bits>>(c, v, bytes);
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        const __m256i w0 = Widened<kQCodeOf<Bits>>(c, v, k, 0, bytes), w1 = Widened<kQCodeOf<Bits>>(c, v, k, 1, bytes);
        const int dword = PairDword(v / 4, v % 4, k);
#pragma GCC unroll 4
        for (int o = 0; o < kOut; ++o) {
          const __m256i x = _mm256_set1_epi32(Load32(xb + 2 * o * xq_stride + 4 * dword));
          sums[o][0] = _mm256_add_epi32(sums[o][0], _mm256_madd_epi16(w0, x));
          sums[o][1] = _mm256_add_epi32(sums[o][1], _mm256_madd_epi16(w1, x));
          __asm__("" : "+x"(sums[o][0]), "+x"(sums[o][1]));  // GCC re-associated the chains into spills
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      __m256 d, m;
      BlockDM<Bits>(c, scales, b, h, d, m);
      for (int o = 0; o < kOut; ++o) {
        const float* sc = xs + 2 * o * xs_stride + 2 * b;  // the pair's scales: dx, dx * sum(q); dx / 256, ...
        const float dx = sc[xs_stride], sum = sc[1] + sc[xs_stride + 1];
        acc[o][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[o][h]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[o][h]);
        acc[o][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(sum), acc[o][h]);
      }
    }
  }
  for (int64_t h = 0; h < 2 && 8 * h < valid; ++h)
    for (int o = 0; o < kOut; ++o) StoreHalf(acc[o][h], h, valid, bias, y + o * y_stride);
}

// Pairs [0, R) against a block whose codes are already widened (wide[2v + k][h]) and whose d and m of rows
// 8h..8h+7 are d[h] and m[h], their scaled sums
// added to acc[o] (16 floats a pair, in memory): GroupPairsWidenedOnce's tile.
template <int R>
ALWAYS_INLINE void BlockPairs(const __m256i (*wide)[2], const __m256* d, const __m256* m, const int8_t* xb,
                              int64_t xq_stride, const float* sc, int64_t xs_stride, float (*acc)[kQGroup]) {
  __m256i sums[R][2];
  for (int o = 0; o < R; ++o) sums[o][0] = sums[o][1] = _mm256_setzero_si256();
#pragma GCC unroll 16
  for (int vk = 0; vk < 16; ++vk) {
    const __m256i w0 = _mm256_load_si256(&wide[vk][0]), w1 = _mm256_load_si256(&wide[vk][1]);
    const int dword = PairDword(vk / 8, vk / 2 % 4, vk % 2);
#pragma GCC unroll 4
    for (int o = 0; o < R; ++o) {
      const __m256i x = _mm256_set1_epi32(Load32(xb + 2 * o * xq_stride + 4 * dword));
      sums[o][0] = _mm256_add_epi32(sums[o][0], _mm256_madd_epi16(w0, x));
      sums[o][1] = _mm256_add_epi32(sums[o][1], _mm256_madd_epi16(w1, x));
      __asm__("" : "+x"(sums[o][0]), "+x"(sums[o][1]));
    }
  }
  for (int h = 0; h < 2; ++h) {
    for (int o = 0; o < R; ++o) {
      const float* s = sc + 2 * o * xs_stride;
      const float dx = s[xs_stride], sum = s[1] + s[xs_stride + 1];
      __m256 a = _mm256_load_ps(acc[o] + 8 * h);
      a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[o][h]), _mm256_mul_ps(d[h], _mm256_set1_ps(dx)), a);
      _mm256_store_ps(acc[o] + 8 * h, _mm256_fmadd_ps(m[h], _mm256_set1_ps(sum), a));
    }
  }
}

// Rows [0, MT) of x against one group, as the AVX-512 build's (Pairs: y[i / 2] from rows i and i + 1).
template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRows(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                             const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                             int64_t KB, int64_t valid) {
  static_assert(!Pairs || MT % 2 == 0, "a pair is two rows");
  if constexpr (Pairs) {
    return GroupPairs<Bits, S, MT>(codes, scales, xq, xq_stride, xs, xs_stride, bias, y, y_stride, KB, valid);
  }
  constexpr int kOut = MT;
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
  for (int64_t h = 0; h < 2 && 8 * h < valid; ++h) {
    __m256 acc[kOut];
    for (int o = 0; o < kOut; ++o) acc[o] = _mm256_setzero_ps();
    for (int64_t b = 0; b < KB; ++b) {
      const uint8_t* c = codes + b * kQBlockBytesOf<Bits> + 32 * h;
      if (h == 0) PrefetchAhead<Bits>(c, BlockScalesAt<Bits>(scales, b));  // the second half finds them in cache
      const int8_t* xb = xq + b * kQBlock;
      constexpr int kCode = kQCodeOf<Bits>;
      __m256i sums[kOut];
      if constexpr (kCode == 4 || kCode == 5) {
        __m256i w[8];  // w[q]: 8 rows x columns 4q..4q+3 of the block
        for (int j = 0; j < 4; ++j) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j));
          w[j] = _mm256_and_si256(raw, nibble), w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
        }
        if constexpr (kCode == 5) {
          const uint8_t* fifth = codes + b * kQBlockBytesOf<Bits> + kQ4BlockBytes + 4 * h;
          for (int q = 0; q < 8; ++q) {
            uint32_t bits;
            __builtin_memcpy(&bits, fifth + 8 * q, 4);
            w[q] = _mm256_or_si256(w[q], FifthBits(bits));
          }
        }
        for (int o = 0; o < kOut; ++o) sums[o] = BlockDot<kCode>(w, xb + o * xq_stride, ones);
      } else {
        __m256i halves[16];
        CodeNibbles<kCode>(c, halves);
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
      __m256 d, m;
      BlockDM<Bits>(codes + b * kQBlockBytesOf<Bits>, scales, b, h, d, m);
      for (int o = 0; o < kOut; ++o) {
        const float* sc = xs + o * xs_stride + 2 * b;
        const float dx = sc[0], sum = sc[1];
        acc[o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[o]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[o]);
        acc[o] = _mm256_fmadd_ps(m, _mm256_set1_ps(sum), acc[o]);
      }
    }
    for (int o = 0; o < kOut; ++o) StoreHalf(acc[o], h, valid, bias, y + o * y_stride);
  }
}

// Batched decode and prefill with 16-bit activations: GroupPairs widens each block's codes once a
// tile of kTileRows / 2 pairs, a fifth of a tile's vector instructions. Here a block's codes are widened
// once into L1 for every tile (BlockPairs), whose sums go through memory from block to block: a group
// against `pairs` pairs (whole tiles, at most kWidenedMaxPairs: a task's rows). Only for K up to
// kWidenedMaxBlocks blocks: with longer rows (2048, 4864) the tiles, each streaming every pair's row
// of x past the codes, ran 0.86-0.94x GroupPairs' (benchmarks/tables/avx2_zen3.md).
constexpr int64_t kWidenedMaxPairs = 32, kWidenedMaxBlocks = 40;

template <int Bits, typename S>
void GroupPairsWidenedOnce(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                           const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                           int64_t KB, int64_t valid, int64_t pairs) {
  constexpr int kPairs = kTileRows / 2;
  alignas(32) __m256i wide[16][2];
  alignas(32) float acc[kWidenedMaxPairs][kQGroup];
  for (int64_t o = 0; o < pairs; ++o)
    for (int64_t j = 0; j < kQGroup; ++j) acc[o][j] = 0.f;
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* c = codes + b * kQBlockBytesOf<Bits>;
    PrefetchAhead<Bits>(c, BlockScalesAt<Bits>(scales, b));
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) {
      __m256i bytes[2];
      VectorBytes<kQCodeOf<Bits>>(c, v, bytes);
      for (int k = 0; k < 2; ++k)
        for (int h = 0; h < 2; ++h) _mm256_store_si256(&wide[2 * v + k][h], Widened<kQCodeOf<Bits>>(c, v, k, h, bytes));
    }
    __m256 d[2], m[2];
    for (int h = 0; h < 2; ++h) BlockDM<Bits>(c, scales, b, h, d[h], m[h]);
    for (int64_t o = 0; o < pairs; o += kPairs)
      BlockPairs<kPairs>(wide, d, m, xq + 2 * o * xq_stride + 2 * kQBlock * b, xq_stride,
                         xs + 2 * o * xs_stride + 2 * b, xs_stride, acc + o);
  }
  for (int64_t o = 0; o < pairs; ++o)
    for (int64_t j = 0; j < valid; ++j) y[o * y_stride + j] = acc[o][j] + (bias ? bias[j] : 0.f);
}
