// SIMD math shared by the per-ISA kernels (paged attention, gated activation, block offsets), with GCC vector
// extensions. Included INSIDE each kernel's ISA namespace (it has no includes of its own), so every
// build gets its own copy compiled with its own -m flags and no inline function is shared between
// builds. Needs ALWAYS_INLINE and <cstdint>'s integer types from the includer.

// Floats in one vector register of this build. GCC splits a wider vector type into several
// registers, and a loop that keeps many of those live spills to the stack (AVX2 prefill
// attention with 16-lane vectors ran 5.6x slower than with AVX-512's).
#if defined(__AVX512F__)
constexpr int kRegisterLanes = 16;
#elif defined(__AVX__)
constexpr int kRegisterLanes = 8;
#else
constexpr int kRegisterLanes = 4;
#endif

template <int W>
struct V {
  typedef float F __attribute__((vector_size(W * 4)));
  typedef int32_t I __attribute__((vector_size(W * 4)));
};

template <class F> ALWAYS_INLINE F Splat(float s) { return F{} + s; }
template <class F> ALWAYS_INLINE F Max(F a, F b) { return a > b ? a : b; }
template <class F> ALWAYS_INLINE F Min(F a, F b) { return a < b ? a : b; }

// e^x for x in [-87, 88] (clamped), Cephes polynomial: x = n ln2 + r, e^x = 2^n e^r.
template <class F, class I>
ALWAYS_INLINE F Exp(F x) {
  x = Min(Max(x, Splat<F>(-87.f)), Splat<F>(88.f));
  const F n = (x * 1.44269504f + 12582912.f) - 12582912.f;  // round(x / ln2) via the 1.5*2^23 trick
  const F r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2 in two steps (hi, lo)
  F p = Splat<F>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;                                         // e^r
  const I pow2 = (__builtin_convertvector(n, I) + 127) << 23;         // 2^n as float bits
  return p * (F)pow2;
}

// c * tanh(s / c), with tanh(x) = 1 - 2 / (e^{2x} + 1).
template <class F, class I>
ALWAYS_INLINE F Softcap(F s, float c) {
  return (1.f - 2.f / (Exp<F, I>(s * (2.f / c)) + 1.f)) * c;
}

// half -> float, for the build without F16C: sign, exponent rebias, subnormals normalised.
ALWAYS_INLINE float HalfToFloat(uint16_t h) {
  const uint32_t sign = (uint32_t{h} & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // 112 = 127 - 15
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: mant * 2^-24
    float f = static_cast<float>(mant) * (1.f / 16777216.f);
    __builtin_memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// Whether this build turns a register's worth of raw halves (F16C) or int8 codes (AVX2's sign
// extension, vpmovsxbd) into floats in one step, for registers R of 16 (AVX-512) or 8 lanes.
#if defined(__F16C__)
constexpr bool kHalfRegisters = true;
#else
constexpr bool kHalfRegisters = false;
#endif
#if defined(__AVX2__)
constexpr bool kCodeRegisters = true;
#else
constexpr bool kCodeRegisters = false;
#endif

// One register R of floats from the sizeof(R) / 4 halves at `in` (raw bytes, any alignment).
template <class R>
ALWAYS_INLINE R HalvesRegister(const unsigned char* in) {
#if defined(__AVX512F__)
  if constexpr (sizeof(R) == 64) {
    typedef short H16 __attribute__((vector_size(32)));
    H16 h;
    __builtin_memcpy(&h, in, 32);
    return __builtin_ia32_vcvtph2ps512_mask(h, R{}, (unsigned short)0xffff, 4);
  }
#endif
#if defined(__F16C__)
  if constexpr (sizeof(R) == 32) {
    typedef short H8 __attribute__((vector_size(16)));
    H8 h;
    __builtin_memcpy(&h, in, 16);
    return __builtin_ia32_vcvtph2ps256(h);
  }
#endif
  (void)in;
  return R{};  // not reached: callers check kHalfRegisters
}

// One register R of floats from the sizeof(R) / 4 int8 codes at `in` (unscaled). GCC turns
// __builtin_convertvector from int8 lanes into one scalar conversion per lane, which made int8-cache
// attention twice as slow as the fp16 cache's; so the codes are sign-extended first.
template <class R>
ALWAYS_INLINE R CodesRegister(const unsigned char* in) {
  typedef char Q16 __attribute__((vector_size(16)));
#if defined(__AVX512F__)
  if constexpr (sizeof(R) == 64) {
    typedef int32_t I16 __attribute__((vector_size(64)));
    Q16 q;
    __builtin_memcpy(&q, in, 16);
    return __builtin_convertvector((I16)__builtin_ia32_pmovsxbd512_mask(q, I16{}, (unsigned short)0xffff), R);
  }
#endif
#if defined(__AVX2__)
  if constexpr (sizeof(R) == 32) {  // 8 codes as the low half of a register (vmovq): no trip through the stack
    typedef int32_t I8 __attribute__((vector_size(32)));
    typedef long long L2 __attribute__((vector_size(16)));
    long long eight;
    __builtin_memcpy(&eight, in, 8);
    const L2 q = {eight, 0};
    return __builtin_convertvector((I8)__builtin_ia32_pmovsxbd256((Q16)q), R);
  }
#endif
  (void)in;
  return R{};  // not reached: callers check kCodeRegisters
}

// n half floats (raw bytes, any alignment) -> n floats, a register at a time where the build can.
ALWAYS_INLINE void HalvesToFloats(const void* halves, float* out, int64_t n) {
  const unsigned char* in = static_cast<const unsigned char*>(halves);
  int64_t i = 0;
#if defined(__F16C__)  // kHalfRegisters
  for (; i + kRegisterLanes <= n; i += kRegisterLanes) {
    const typename V<kRegisterLanes>::F f = HalvesRegister<typename V<kRegisterLanes>::F>(in + 2 * i);
    __builtin_memcpy(out + i, &f, sizeof(f));
  }
  for (; kRegisterLanes == 16 && i + 8 <= n; i += 8) {
    const V<8>::F f = HalvesRegister<V<8>::F>(in + 2 * i);
    __builtin_memcpy(out + i, &f, sizeof(f));
  }
#endif
  for (; i < n; ++i) {
    uint16_t h;
    __builtin_memcpy(&h, in + 2 * i, 2);
    out[i] = HalfToFloat(h);
  }
}

// n int8 codes (raw bytes, any alignment) times scale -> n floats, a register at a time where the build can.
ALWAYS_INLINE void CodesToFloats(const void* codes, float scale, float* out, int64_t n) {
  const unsigned char* in = static_cast<const unsigned char*>(codes);
  int64_t i = 0;
#if defined(__AVX2__)  // kCodeRegisters
  for (; i + kRegisterLanes <= n; i += kRegisterLanes) {
    const typename V<kRegisterLanes>::F f = CodesRegister<typename V<kRegisterLanes>::F>(in + i) * scale;
    __builtin_memcpy(out + i, &f, sizeof(f));
  }
  for (; kRegisterLanes == 16 && i + 8 <= n; i += 8) {
    const V<8>::F f = CodesRegister<V<8>::F>(in + i) * scale;
    __builtin_memcpy(out + i, &f, sizeof(f));
  }
#endif
  for (; i < n; ++i) out[i] = static_cast<float>(static_cast<int8_t>(in[i])) * scale;
}
