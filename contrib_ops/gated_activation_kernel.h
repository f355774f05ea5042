// Interface between the GatedActivation op (gated_activation.cc) and its kernel
// (gated_activation_kernel.cc, compiled once per ISA). Nothing from the standard library beyond
// integer types: no inline function may be shared between builds of different ISAs.
#pragma once

#include <cstdint>

namespace ortserve {

enum class Activation : int { kSilu = 0, kGeluTanh = 1 };

// The kernel, one build per instruction set (gated_activation_kernel.cc): rows of x [rows, 2I].
#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
namespace avx512 { void GatedRows(const float* x, float* y, int64_t rows, int64_t inner, Activation act); }
namespace avx2 { void GatedRows(const float* x, float* y, int64_t rows, int64_t inner, Activation act); }
#endif
namespace generic { void GatedRows(const float* x, float* y, int64_t rows, int64_t inner, Activation act); }

}  // namespace ortserve
