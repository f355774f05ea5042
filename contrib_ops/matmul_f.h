// ortserve::MatMulF (domain "ortserve", since op_version 8): y = x @ W.T (+ bias) in fp32, for the
// linears of an fp32 model:
//   x f32 [T, K], W f32 [N, K] (the checkpoint's own layout; a tied embedding is passed as it is),
//   bias f32 [N] (optional; [0] = none) -> y f32 [T, N]; since op_version 9 the norm or gated activation
//   in front of the linear may run inside it: optional inputs norm_weight, residual, output sum,
//   attributes norm_epsilon, gated (linear_input.h).
// A constant W is repacked once, when the session is built, into the op's own memory in panels of 32
// rows (matmul_f_kernel.h); any other W is packed per call. onnxruntime's MatMul reads a decode
// step's weights at 22-24 GB/s where this layout reads them at the memory's speed
// (benchmarks/tables/matmul_f.md).
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

namespace ortserve {

// The op's definition, for RegisterCustomOps; it lives as long as the library.
Ort::Custom::OrtLiteCustomOp* MatMulFOp();

}  // namespace ortserve
