// The two attention ops, for RegisterCustomOps (register_ops.cc). Each definition lives as long as
// the library. They share paged_attention_core.{h,cc}.
//   PagedAttention (paged_attention.cc): query, key, value                  (op set 1, since op_version 1)
//   PackedPagedAttention (paged_attention_packed.cc): packed qkv, in-op q/k norm and rotary (op_version 3)
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include <vector>

namespace ortserve {

Ort::Custom::OrtLiteCustomOp* PagedAttentionOp();
// PackedPagedAttention with float, half and int8 caches (one kernel each, same op name).
std::vector<Ort::Custom::OrtLiteCustomOp*> PackedPagedAttentionOps();

}  // namespace ortserve
