// SIMD math shared by the per-ISA kernels (paged attention, gated activation), with GCC vector
// extensions. Included INSIDE each kernel's ISA namespace (it has no includes of its own), so every
// build gets its own copy compiled with its own -m flags and no inline function is shared between
// builds. Needs ALWAYS_INLINE and <cstdint>'s int32_t from the includer.

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
