// Interface between the MatMulQ4 op (matmul_q4.cc) and its kernels (matmul_q4_kernel.cc, compiled
// once per ISA). Nothing from the standard library beyond integer types: no inline function may be
// shared between builds of different ISAs.
//
// The weight layout (the numpy reference pack_q4 in paged_attention_reference.py is its definition):
// W [N, K] as w = d * q + m, q in 0..15, one (d, m) per row and block of 32 columns along K. Rows are
// taken 16 at a time (a group; N is padded to whole groups with q = d = m = 0), blocks 32 columns at
// a time (K padded with q = 0):
//   codes  u8 [G, KB, 256]: byte c * 64 + r * 4 + j of block b holds q[16g + r, 32b + 4c + j] in its
//          low nibble and q[16g + r, 32b + 16 + 4c + j] in its high one (c < 4, r < 16, j < 4), so a
//          64-byte load and a nibble mask give 16 rows x 4 columns: one int32 lane per row.
//   scales f16 or f32 [G, KB, 2, 16]: d then m of the group's 16 rows.
#pragma once

#include <cstdint>

namespace ortserve {

constexpr int64_t kQ4Block = 32, kQ4Group = 16, kQ4BlockBytes = 256;

// QuantizeRows: rows of x [T, K] to int8, per block of 32: xq = rint(x * 127 / amax) (amax = max |x| of
// the block, 0 -> codes 0), into xq [T, KB * 32] (zero-padded) and xs [T, KB, 2] = {dx, dx * sum(xq)}
// with dx = amax / 127.
// Q4Tile: y[t, 16g + r] = sum_b xs[t,b,0] * d * dot(q, xq) + m * xs[t,b,1] (+ bias) for rows
// [t0, t1) and groups [g0, g1); only columns < N are written. half: scales are fp16 (else f32).
#define ORTSERVE_Q4_KERNELS                                                                             \
  void QuantizeRows(const float* x, int64_t T, int64_t K, int8_t* xq, float* xs);                       \
  void Q4Tile(const uint8_t* codes, const void* scales, bool half, const int8_t* xq, const float* xs,   \
              const float* bias, float* y, int64_t KB, int64_t N, int64_t t0, int64_t t1, int64_t g0,   \
              int64_t g1);

#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
namespace avx512 { ORTSERVE_Q4_KERNELS }
namespace avx2 { ORTSERVE_Q4_KERNELS }
#endif
namespace generic { ORTSERVE_Q4_KERNELS }

#undef ORTSERVE_Q4_KERNELS

}  // namespace ortserve
