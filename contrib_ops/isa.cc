// See isa.h.
#include "isa.h"

#include <cstdlib>
#include <string>

#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
#include <cpuid.h>
#endif

namespace ortserve {

Isa KernelIsa() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return Isa::kGeneric;
#else
  const char* cap = std::getenv("ORTSERVE_KERNEL_ISA");
  const std::string want = cap && *cap ? cap : "avx512";  // set but empty: no cap, as unset
  if (want == "avx512" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni"))
    return Isa::kAvx512;
  if (want != "generic" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Isa::kAvx2;
  return Isa::kGeneric;
#endif
}

bool IsAmdZen4() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return false;
#else
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amd = ebx == 0x68747541 && edx == 0x69746e65 && ecx == 0x444d4163;  // "AuthenticAMD"
  if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned family = ((eax >> 8) & 0xf) + ((eax >> 20) & 0xff);  // base + extended (base 0xf)
  return family == 25 && __builtin_cpu_supports("avx512f");
#endif
}

}  // namespace ortserve
