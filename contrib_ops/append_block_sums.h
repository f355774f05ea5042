// ortserve::AppendBlockSums (domain "ortserve", version 1): y = [x | sum of x over each block of
// block_size columns], x [T, K] -> y [T, K + K / block_size]. One node for what was Reshape +
// ReduceSum + Concat in front of every MatMulNBits whose int4 weights keep Q4_1 GGUF codes (the
// trailing blocks of those weights weigh the block sums: export/quantize.py append_residual_blocks).
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

namespace ortserve {

// The op's definition, for RegisterCustomOps; it lives as long as the library.
Ort::Custom::OrtLiteCustomOp* AppendBlockSumsOp();

}  // namespace ortserve
