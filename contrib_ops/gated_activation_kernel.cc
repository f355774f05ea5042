// GatedActivation kernel (see gated_activation.h), compiled once per ISA like the attention kernel
// (CMakeLists.txt): one register of floats at a time (kRegisterLanes) with GCC vector extensions;
// a row's tail goes through the same vector code on a padded copy, so every element sees the same
// arithmetic.
#include "gated_activation_kernel.h"

#include "kernel_build.h"

namespace ortserve {
namespace ORTSERVE_ISA {
namespace {

#include "simd_math.h"  // V<W>, kRegisterLanes, Splat, Max, Min, Exp: in this ISA's namespace

constexpr int W = kRegisterLanes;
typedef V<W>::F F;
typedef V<W>::I I;

// silu(g) u = g / (1 + e^-g) u;  gelu_tanh(g) u = g / 2 (1 + tanh z) u with
// z = sqrt(2/pi) (g + 0.044715 g^3), and 1 + tanh z = 2 / (1 + e^-2z): both are g / (1 + e^-a) u,
// exact in both tails (no 1 - 1 cancellation).
ALWAYS_INLINE F Gated(F g, F u, Activation act) {
  const F a = act == Activation::kSilu ? g : 1.5957691216057308f * (g + 0.044715f * g * g * g);  // 2z
  return g / (1.f + Exp<F, I>(-a)) * u;
}

ALWAYS_INLINE F Load(const float* p) {
  F v;
  __builtin_memcpy(&v, p, sizeof(F));
  return v;
}

ALWAYS_INLINE void Store(float* p, F v) { __builtin_memcpy(p, &v, sizeof(F)); }

}  // namespace

void GatedRows(const float* x, float* y, int64_t rows, int64_t inner, Activation act) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = x + r * 2 * inner;
    const float* up = gate + inner;
    float* out = y + r * inner;
    int64_t i = 0;
    for (; i + W <= inner; i += W) Store(out + i, Gated(Load(gate + i), Load(up + i), act));
    if (i < inner) {
      float g[W] = {}, u[W] = {}, o[W];
      for (int64_t j = i; j < inner; ++j) g[j - i] = gate[j], u[j - i] = up[j];
      Store(o, Gated(Load(g), Load(u), act));
      for (int64_t j = i; j < inner; ++j) out[j] = o[j - i];
    }
  }
}

}  // namespace ORTSERVE_ISA
}  // namespace ortserve
