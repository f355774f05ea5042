// Interface between the AddBlockOffsets op (block_offsets.cc) and its kernels
// (block_offsets_kernel.cc, compiled once per ISA). Nothing from the standard library beyond
// integer types: no inline function may be shared between builds of different ISAs.
#pragma once

#include <cstdint>

namespace ortserve {

// BlockSums: sums[t, b] = x[t, b * block_size : (b + 1) * block_size] summed, x [T, K], sums [T, K / block_size].
// AddOffsetColumns: out[t, n] = y[t, n] + sum_b sums[t, b] * offsets[b, n] for columns n in [n0, n1):
// y and out [T, N], offsets [nb, N]. AddHalfOffsetColumns: the same with fp16 offsets, for up to a
// tile of rows (decode batches), converted as they stream past; HalfRowsToFloats converts n of them (for many rows).
#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
namespace avx512 {
void BlockSums(const float* x, float* sums, int64_t T, int64_t K, int64_t block_size);
void AddOffsetColumns(const float* y, const float* sums, const float* offsets, float* out, int64_t T, int64_t nb,
                      int64_t N, int64_t n0, int64_t n1);
void AddHalfOffsetColumns(const float* y, const float* sums, const uint16_t* offsets, float* out, int64_t T,
                          int64_t nb, int64_t N, int64_t n0, int64_t n1);
void HalfRowsToFloats(const uint16_t* halves, float* out, int64_t n);
}
namespace avx2 {
void BlockSums(const float* x, float* sums, int64_t T, int64_t K, int64_t block_size);
void AddOffsetColumns(const float* y, const float* sums, const float* offsets, float* out, int64_t T, int64_t nb,
                      int64_t N, int64_t n0, int64_t n1);
void AddHalfOffsetColumns(const float* y, const float* sums, const uint16_t* offsets, float* out, int64_t T,
                          int64_t nb, int64_t N, int64_t n0, int64_t n1);
void HalfRowsToFloats(const uint16_t* halves, float* out, int64_t n);
}
#endif
namespace generic {
void BlockSums(const float* x, float* sums, int64_t T, int64_t K, int64_t block_size);
void AddOffsetColumns(const float* y, const float* sums, const float* offsets, float* out, int64_t T, int64_t nb,
                      int64_t N, int64_t n0, int64_t n1);
void AddHalfOffsetColumns(const float* y, const float* sums, const uint16_t* offsets, float* out, int64_t T,
                          int64_t nb, int64_t N, int64_t n0, int64_t n1);
void HalfRowsToFloats(const uint16_t* halves, float* out, int64_t n);
}

}  // namespace ortserve
