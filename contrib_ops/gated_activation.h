// ortserve::GatedActivation (domain "ortserve", since op_version 3): y = act(gate) * up for x = [gate | up],
// x [T, 2I] -> y [T, I], act = silu or gelu_tanh (attribute `activation`). One node where the
// gated MLP had Split, the activation's one or two nodes, and Mul. The numpy reference is
// gated_activation() in paged_attention_reference.py.
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include "gated_activation_kernel.h"

namespace ortserve {

// The op's definition, for RegisterCustomOps; it lives as long as the library.
Ort::Custom::OrtLiteCustomOp* GatedActivationOp();

}  // namespace ortserve
