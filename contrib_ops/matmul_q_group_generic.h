// MatMulQ's group kernel in plain C++ (see matmul_q_kernel.cc): kTileRows, kRowsOuter, BlockAmax, QuantizeAt,
// QuantizePairAt and GroupRows, one code at a time: the reference the SIMD builds are tested against.
// Included INSIDE matmul_q_kernel.cc's ISA namespace, after its shared helpers; no includes of its own.

constexpr int kTileRows = 2;
constexpr bool kRowsOuter = false;

// Only the AVX2 build widens a block's codes once for many pairs (matmul_q_group_avx2.h); declared for
// matmul_q_kernel.cc's Tile, which never calls it here.
constexpr int64_t kWidenedMaxPairs = 0, kWidenedMaxBlocks = 0;
template <int Bits, typename S>
void GroupPairsWidenedOnce(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                           const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                           int64_t KB, int64_t valid, int64_t pairs);

ALWAYS_INLINE float BlockAmax(const float* in) {
  float amax = 0.f;
  for (int64_t i = 0; i < kQBlock; ++i) amax = __builtin_fmaxf(amax, __builtin_fabsf(in[i]));
  return amax;
}

// The block's codes into out, and the sums of its halves' (columns 0..15, 16..31) into halves.
ALWAYS_INLINE void QuantizeAt(const float* in, float inverse, int8_t* out, int32_t* halves) {
  halves[0] = halves[1] = 0;
  for (int64_t i = 0; i < kQBlock; ++i) {
    const float v = __builtin_fminf(__builtin_fmaxf(__builtin_rintf(in[i] * inverse), -127.f), 127.f);
    out[i] = static_cast<int8_t>(v);
    halves[i / (kQBlock / 2)] += out[i];
  }
}

// QuantizeAt, and the codes of what it misses, x - dx * q rounded once, on the grid kResidualSteps
// times finer (block b of the pair's rows: codes, then the residual's; sums: the halves' code sums, then the
// residual's).
ALWAYS_INLINE void QuantizePairAt(const float* in, float inverse, float dx, int8_t* pair, int64_t KB, int64_t b,
                                  int32_t* sums) {
  int8_t *out = pair + kQBlock * b, *fine_out = pair + kQBlock * (KB + b);  // the pair's two int8 rows
  float rest[kQBlock];
  QuantizeAt(in, inverse, out, sums);
  for (int64_t i = 0; i < kQBlock; ++i) rest[i] = __builtin_fmaf(-dx, static_cast<float>(out[i]), in[i]);
  QuantizeAt(rest, inverse * kResidualSteps, fine_out, sums + 2);
}

// The code of row r and column 4q + j of the block at c.
template <int Bits>
ALWAYS_INLINE int32_t Code(const uint8_t* c, int64_t r, int64_t q, int64_t j) {
  if constexpr (Bits == 8) return c[64 * q + 4 * r + j];
  const uint8_t byte = c[64 * (q % 4) + 4 * r + j];
  const int32_t low = q < 4 ? byte & 0x0F : byte >> 4;
  if constexpr (Bits == 4) return low;
  if constexpr (Bits == kQ4NL) return kQ4NLCodes[low];
  const int64_t lane = 4 * r + j;
  return low | (((c[kQ4BlockBytes + 8 * q + lane / 8] >> (lane % 8)) & 1) << 4);
}

template <typename S>
ALWAYS_INLINE float Scale(const S* p) {
  if constexpr (sizeof(S) == 2) return HalfToFloat(*p);
  else return *p;
}

template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRows(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                             const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                             int64_t KB, int64_t valid) {
  for (int64_t r = 0; r < valid; ++r) {
    float acc[MT] = {};
    for (int i = 0; i < MT; ++i)
      for (int64_t b = 0; b < KB; ++b) {
        const uint8_t* c = codes + b * kQBlockBytesOf<Bits>;
        const int8_t* xb = xq + i * xq_stride + b * kQBlock;
        int32_t dot = 0;
        for (int64_t q = 0; q < 8; ++q)
          for (int64_t j = 0; j < 4; ++j) dot += Code<kQCodeOf<Bits>>(c, r, q, j) * xb[4 * q + j];
        const S* sb = BlockScalesAt<Bits>(scales, b) + r;
        const uint8_t* sub = c + kQCodeBytesOf<Bits>;  // a super-block layout's sub-scales (and mins)
        float d = Scale(sb);
        if constexpr (kQCentredOf<Bits> && kQSuperBlockDMOf<Bits>) d *= static_cast<float>(static_cast<int8_t>(sub[r]));
        float m = kQCentredOf<Bits> ? -kQMiddleOf<Bits> * d : Scale(sb + kQGroup);
        if constexpr (!kQCentredOf<Bits> && kQSuperBlockDMOf<Bits>) {  // d * sc and -dmin * mn
          d *= static_cast<float>(sub[r]), m *= static_cast<float>(sub[kQGroup + r]);
        }
        const float* sc = xs + i * xs_stride + 2 * b;
        acc[i] += static_cast<float>(dot) * (d * sc[0]);
        acc[i] += m * sc[1];
      }
    const float add = bias ? bias[r] : 0.f;
    if constexpr (Pairs) {
      for (int i = 0; i + 1 < MT; i += 2) y[i / 2 * y_stride + r] = acc[i] + acc[i + 1] + add;
    } else {
      for (int i = 0; i < MT; ++i) y[i * y_stride + r] = acc[i] + add;
    }
  }
}
