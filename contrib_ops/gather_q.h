// ortserve::GatherQ4 and ortserve::GatherQ8 (domain "ortserve", since op_version 6; GatherQ5 since 7, GatherQ4NL
// since 10, GatherQ6K since 11, GatherQ4K and GatherQ5K since 12, the centred ones since 13, GatherQ3K since 14,
// GatherQ4XS since 15, GatherQ2K since 16): rows of a MatMulQ4 / Q8 / Q5 / Q4NL / Q4K / Q5K / Q2K / Q3K / Q6K / Q4XS
// weight, dequantised: y[t] = d * q + m (Q4K / Q5K: (d * sc) * q + (-dmin * mn), as gguf's dequantiser; Q3K / Q6K:
// (d * sc) * (q - middle), middle 4 / 32, their scales [G, ceil(KB / 8), 16]; Q2K: (d * sc) * q + (-dmin * mn) per 16
// columns) of row indices[t], so a tied embedding and LM head
// share one copy of the codes (matmul_q_kernel.h has the layout).
//   codes u8 [G, KB, 256 or 512], scales f16 or f32 [G, KB, 2, 16], indices i64 [T] -> y f32 [T, K];
//   attributes N (the rows) and K (the row width). An index outside [0, N) fails the run, naming it.
// The numpy references are gather_q() and gather_sub16() in matmul_q_reference.py.
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include <vector>

namespace ortserve {

// The ops' definitions (4 and 8 bits, f16 and f32 scales), for RegisterCustomOps.
std::vector<Ort::Custom::OrtLiteCustomOp*> GatherQOps();

}  // namespace ortserve
