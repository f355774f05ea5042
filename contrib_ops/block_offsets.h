// ortserve::AddBlockOffsets (domain "ortserve", since op_version 4): out = y + block_sums(x) @ offsets,
// where block_sums(x)[t, b] is x summed over columns [b * block_size, (b + 1) * block_size).
// x [T, K], y [T, N], offsets f32 or f16 [K / block_size, N] -> out [T, N] (f16 since op_version 5: half the
// bytes, for minimums that fp16 holds exactly, as Q4_1's and Q5_1's). The exact float block minimums of
// GGUF formats with them (Q4_1, Q5_1, Q4_K, Q5_K: w = d * q + m) next to a MatMulNBits that keeps
// the codes on its fast integer-zero-point path (export/storage.py): one node where Reshape,
// ReduceSum and Gemm were three, four times a layer. The numpy reference is add_block_offsets() in
// paged_attention_reference.py.
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include "block_offsets_kernel.h"

#include <vector>

namespace ortserve {

// The op's definitions (f32 and f16 offsets), for RegisterCustomOps; they live as long as the library.
std::vector<Ort::Custom::OrtLiteCustomOp*> AddBlockOffsetsOps();

}  // namespace ortserve
