// Interface between the AddBlockOffsets op (block_offsets.cc) and its kernel
// (block_offsets_kernel.cc, compiled once per ISA). Nothing from the standard library beyond
// integer types: no inline function may be shared between builds of different ISAs.
#pragma once

#include <cstdint>

namespace ortserve {

// out[t, n] += sum_b sums[t, b] * offsets[b, n] for columns n in [n0, n1): sums [T, nb], offsets
// [nb, N], out [T, N].
#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
namespace avx512 {
void AddOffsetColumns(const float* sums, const float* offsets, float* out, int64_t T, int64_t nb, int64_t N,
                      int64_t n0, int64_t n1);
}
namespace avx2 {
void AddOffsetColumns(const float* sums, const float* offsets, float* out, int64_t T, int64_t nb, int64_t N,
                      int64_t n0, int64_t n1);
}
#endif
namespace generic {
void AddOffsetColumns(const float* sums, const float* offsets, float* out, int64_t T, int64_t nb, int64_t N,
                      int64_t n0, int64_t n1);
}

}  // namespace ortserve
