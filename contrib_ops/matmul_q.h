// ortserve::MatMulQ4 and ortserve::MatMulQ8 (domain "ortserve", since op_version 6; MatMulQ5 since 7, MatMulQ4NL,
// the 4-bit layout whose codes index GGUF's IQ4 values, since 10; MatMulQ6K, GGUF's Q6_K with its scale per 16
// columns and scales [G, ceil(KB / 8), 16] of d, since 11; MatMulQ4K and MatMulQ5K, GGUF's Q4_K and Q5_K with their
// u8 sub-scales and mins beside the codes and scales [G, ceil(KB / 8), 2, 16] of d and -dmin, since 12; the centred
// MatMulQ4S / Q5S / Q8S / Q4NLS, scales [G, KB, 16] of d, since 13; MatMulQ3K, GGUF's Q3_K, as MatMulQ6K with 3-bit
// codes, since 14; MatMulQ4XS, GGUF's IQ4_XS, since 15; MatMulQ2K, GGUF's Q2_K, 2-bit codes with a u8 sub-scale and
// min per 16 columns beside them and scales [G, ceil(KB / 8), 2, 16] of d and -dmin, since 16): y = x @ W.T (+ bias)
// for a 4- or 8-bit block-quantised W [N, K], w = d * q + m per row and block of 32 columns, with x
// quantised to int8 per block of 32 on the way in (as llama.cpp's Q4_1 x Q8_1 dot product), or with
// activation_bits = 16 to int8 plus an int8 residual (two integer passes; x held to about 16 bits):
//   x f32 [T, K], codes u8 [G, KB, 256 (Q4) or 512 (Q8)], scales f16 or f32 [G, KB, 2, 16],
//   bias f32 [N] (optional; [0] = none) -> y f32 [T, N]; attributes N (the rows; G = ceil(N / 16),
//   KB = ceil(K / 32)), optionally K (checks x) and activation_bits (8, the default, or 16). Since
//   op_version 9 the norm or gated activation in front of the linear may run inside it: optional
//   inputs norm_weight, residual, output sum, attributes norm_epsilon, gated (linear_input.h).
// The layout is in matmul_q_kernel.h. GGUF's block-32 formats map onto it exactly (Q4_1: d, m; Q5_1 likewise;
// Q4_0: m = -8d, Q5_0: m = -16d, Q8_0: q + 128, m = -128d, in the centred MatMulQ4S / Q5S / Q8S, since op_version
// 13, which store d alone), so one node replaces MatMulNBits and AddBlockOffsets. The numpy reference is matmul_q() in
// matmul_q_reference.py.
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include "matmul_q_kernel.h"

#include <vector>

namespace ortserve {

// The ops' definitions (4 and 8 bits, f16 and f32 scales), for RegisterCustomOps; they live as long as
// the library.
std::vector<Ort::Custom::OrtLiteCustomOp*> MatMulQOps();

}  // namespace ortserve
