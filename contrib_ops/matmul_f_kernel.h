// Interface between the MatMulF op (matmul_f.cc) and its kernels (matmul_f_kernel.cc, compiled once
// per ISA). Nothing from the standard library beyond integer types: no inline function may be shared
// between builds of different ISAs.
//
// The weight layout: W [N, K] (y = x @ W.T) in panels of 32 rows, each panel K x 32 with the 32 rows
// side by side (N padded to whole panels with zeros), P = ceil(N / 32) panels of K * 32 floats. Within
// a panel the layout is a build's own (FPack writes it, FTile of the same build reads it):
//   AVX-512, generic: [K, 32], panels[p, k, j] = W[32p + j, k]: a step along K is one 128-byte row;
//   AVX2: [2, K, 16], the panel's two halves apart, panels[p, j / 16, k, j % 16] = W[32p + j, k]: its
//     tiles take a panel a half (16 columns) at a time, and each half is then one dense stream.
// Either way a panel is contiguous, and decode's whole call reads the weight front to back.
#pragma once

#include <cstdint>

namespace ortserve {

constexpr int64_t kFPanel = 32;

constexpr int64_t FPanels(int64_t N) { return (N + kFPanel - 1) / kFPanel; }
constexpr int64_t PackedFloats(int64_t N, int64_t K) { return FPanels(N) * K * kFPanel; }

// FTile: y[t, 32p + j] = sum_k x[t, k] * panels[p, k, j] (+ bias) for rows [t0, t1) of x [T, K] and
// panels [p0, p1); only columns < N are written (y is [T, N]). row_streams: how many streams the
// AVX-512 build reads a panel as for one row of x, 1 or 8 (the other builds have one form of their own).
// FPack: W [N, K] into the build's panels (PackedFloats(N, K) floats), the padding rows zero.
#define ORTSERVE_F_KERNELS                                                                               \
  void FPack(const float* w, int64_t N, int64_t K, float* panels);                                      \
  void FTile(const float* x, int64_t K, const float* panels, const float* bias, float* y, int64_t N, int64_t t0, \
             int64_t t1, int64_t p0, int64_t p1, int row_streams);

#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
namespace avx512 { ORTSERVE_F_KERNELS }
namespace avx2 { ORTSERVE_F_KERNELS }
#endif
namespace generic { ORTSERVE_F_KERNELS }

#undef ORTSERVE_F_KERNELS

}  // namespace ortserve
