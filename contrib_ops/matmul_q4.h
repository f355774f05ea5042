// ortserve::MatMulQ4 (domain "ortserve", since op_version 6): y = x @ W.T (+ bias) for a 4-bit
// block-quantised W [N, K], w = d * q + m per row and block of 32 columns, with x quantised to int8
// per block of 32 on the way in (as llama.cpp's Q4_1 x Q8_1 dot product):
//   x f32 [T, K], codes u8 [G, KB, 256], scales f16 or f32 [G, KB, 2, 16], bias f32 [N] (optional)
//   -> y f32 [T, N]; attributes N (the rows; G = ceil(N / 16), KB = ceil(K / 32)) and, optionally, K.
// The layout is in matmul_q4_kernel.h. GGUF's 4-bit formats map onto it exactly (Q4_0: m = -8d;
// Q4_1: d, m; Q4_K: d * scale, -dmin * min), so one node replaces MatMulNBits and AddBlockOffsets.
// The numpy reference is matmul_q4() in paged_attention_reference.py.
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include "matmul_q4_kernel.h"

#include <vector>

namespace ortserve {

// The op's definitions (f16 and f32 scales), for RegisterCustomOps; they live as long as the library.
std::vector<Ort::Custom::OrtLiteCustomOp*> MatMulQ4Ops();

}  // namespace ortserve
