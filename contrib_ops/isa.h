// Which build of the per-ISA kernels runs (each kernel file is compiled for AVX-512 with VNNI, AVX2 +
// FMA + F16C and plain x86-64; CMakeLists.txt; an AVX-512 CPU without VNNI runs the AVX2 build): the best this CPU supports, capped by
// $ORTSERVE_KERNEL_ISA=avx2|generic so that the tests run every build on one machine.
#pragma once

namespace ortserve {

enum class Isa { kGeneric, kAvx2, kAvx512 };

Isa KernelIsa();

// An AMD Zen 4 (family 25 with AVX-512): AVX-512 on 256-bit units, whose memory reads want other access
// patterns than an Intel Xeon's or a Zen 5's with the same ISA.
bool IsAmdZen4();

// The build of a kernel for KernelIsa(): Pick(avx512::F, avx2::F, generic::F).
template <typename Fn>
Fn PickBuild([[maybe_unused]] Fn avx512, [[maybe_unused]] Fn avx2, Fn generic) {
#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
  switch (KernelIsa()) {
    case Isa::kAvx512: return avx512;
    case Isa::kAvx2: return avx2;
    default: break;
  }
#endif
  return generic;
}

}  // namespace ortserve
