// See isa.h.
#include "isa.h"

#include <cstdlib>
#include <string>

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

}  // namespace ortserve
