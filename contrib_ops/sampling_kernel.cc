// The sampler's exp and chunk sums (see sampling_kernel.h), compiled once per ISA like the other
// kernels (CMakeLists.txt): one register of floats at a time (kRegisterLanes) with GCC vector
// extensions; a chunk's tail goes through the same vector code on a padded copy.
//
// e^x as numpy gives it where the sampler can tell: exactly 0 below -87 (-inf included: a masked
// token is never drawn), +inf above 88 (the sampler then redoes the row with its max subtracted),
// NaN for NaN; between, simd_math.h's polynomial (within 2 ulp of e^x).
#include "sampling_kernel.h"

#include "kernel_build.h"

namespace ortserve {
namespace ORTSERVE_ISA {
namespace {

#include "simd_math.h"  // V<W>, kRegisterLanes, Splat, Max, Min, Exp: in this ISA's namespace

constexpr int W = kRegisterLanes;
typedef V<W>::F F;
typedef V<W>::I I;

ALWAYS_INLINE F ExpOrEdge(F x) {
  const F e = Exp<F, I>(x);
  const F zero = Splat<F>(0.f), inf = Splat<F>(__builtin_inff());
  F w = x < -87.f ? zero : e;
  w = x > 88.f ? inf : w;
  return x != x ? x : w;  // NaN stays NaN
}

ALWAYS_INLINE float Sum(F v) {
  float s = 0.f;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}

}  // namespace

void ExpChunkSums(const float* x, float* w, float* sums, int64_t rows, int64_t vocab, int64_t chunk) {
  const int64_t chunks = (vocab + chunk - 1) / chunk;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * vocab;
    float* wr = w + r * vocab;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * chunk, end = begin + chunk < vocab ? begin + chunk : vocab;
      F acc = Splat<F>(0.f);
      int64_t j = begin;
      for (; j + W <= end; j += W) {
        F v;
        __builtin_memcpy(&v, xr + j, sizeof(F));
        const F e = ExpOrEdge(v);
        __builtin_memcpy(wr + j, &e, sizeof(F));
        acc += e;
      }
      if (j < end) {  // the tail: padded with -inf, whose weight is 0
        float pad[W];
        for (int i = 0; i < W; ++i) pad[i] = j + i < end ? xr[j + i] : -__builtin_inff();
        F v;
        __builtin_memcpy(&v, pad, sizeof(F));
        const F e = ExpOrEdge(v);
        __builtin_memcpy(pad, &e, sizeof(F));
        for (int64_t i = 0; j + i < end; ++i) wr[j + i] = pad[i];
        acc += e;
      }
      sums[r * chunks + c] = Sum(acc);
    }
  }
}

}  // namespace ORTSERVE_ISA
}  // namespace ortserve
