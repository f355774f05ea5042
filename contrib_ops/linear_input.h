// The input stage of a linear (MatMulF, MatMulQ4 / MatMulQ5 / MatMulQ8, since op_version 9): what the op
// does to its rows of x before the product, so that the norm or the gated activation in front of a
// linear is not a node of its own (a decode step of a small model is mostly kernel launches). After
// the op's own inputs and outputs (contrib_ops/README.md, "Linear inputs"):
//   attribute gated  "silu" | "gelu_tanh": x is [T, 2K] = [gate | up], the input act(gate) * up
//   norm_weight      f32 [K]: the input is x' / sqrt(mean(x'^2) + norm_epsilon) * norm_weight
//   residual         f32 [T, K] (with norm_weight): x' = x + residual, written to the output `sum`
// A bias input of shape [0] stands for no bias, so the stage's inputs can follow it. The numpy
// reference is linear_input() in paged_attention_reference.py.
#pragma once

#include "gated_activation_kernel.h"
#include "op_util.h"

#include <cstdint>
#include <string>

namespace ortserve {

class LinearInput {
 public:
  LinearInput(const OrtApi* api, const OrtKernelInfo* info);

  // x is [T, 2K] = [gate | up] when gated, else [T, K].
  bool Gated() const { return gated_; }

  // The width of x for a linear of K inputs.
  int64_t Width(int64_t K) const { return gated_ ? 2 * K : K; }

  // The linear's input [T, K]: x itself when there is no stage, else rows this thread's scratch holds
  // (until its next call). On bad input, error says why (and the result is not to be read).
  const float* Rows(Ort::KernelContext& ctx, const float* x, int64_t T, int64_t K,
                    const Ort::Custom::Tensor<float>* norm_weight, const Ort::Custom::Tensor<float>* residual,
                    Ort::Custom::Tensor<float>* sum, std::string& error) const;

  using GatedFn = void (*)(const float*, float*, int64_t, int64_t, Activation);  // GatedActivation's rows

 private:
  std::string Check(int64_t T, int64_t K, const Ort::Custom::Tensor<float>* norm_weight,
                    const Ort::Custom::Tensor<float>* residual, const Ort::Custom::Tensor<float>* sum) const;

  bool gated_ = false;
  Activation act_ = Activation::kSilu;
  GatedFn gated_rows_ = nullptr;  // this CPU's build of the kernel, when gated
  float epsilon_ = -1.0f;  // unset
  std::string error_;      // of the attributes, reported by Rows
};

}  // namespace ortserve
