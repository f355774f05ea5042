// AddBlockOffsets kernel (see block_offsets.h), compiled once per ISA like the attention kernel:
// for one range of columns, every row gets sum_b sums[t, b] * offsets[b, :]. The range's slice of
// each offsets row is read once and applied to all rows while it is in cache.
#include "block_offsets_kernel.h"

#ifndef ORTSERVE_ISA
#error "compile with -DORTSERVE_ISA=avx512|avx2|generic"
#endif

namespace ortserve {
namespace ORTSERVE_ISA {

void AddOffsetColumns(const float* sums, const float* offsets, float* out, int64_t T, int64_t nb, int64_t N,
                      int64_t n0, int64_t n1) {
  for (int64_t b = 0; b < nb; ++b) {
    const float* row = offsets + b * N;
    for (int64_t t = 0; t < T; ++t) {
      const float s = sums[t * nb + b];
      float* o = out + t * N;
      for (int64_t n = n0; n < n1; ++n) o[n] += s * row[n];  // vectorised by the compiler
    }
  }
}

}  // namespace ORTSERVE_ISA
}  // namespace ortserve
