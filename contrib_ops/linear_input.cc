// See linear_input.h.
#include "linear_input.h"

#include "isa.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ortserve {
namespace {

LinearInput::GatedFn PickGated() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return generic::GatedRows;
#else
  return PickBuild<LinearInput::GatedFn>(avx512::GatedRows, avx2::GatedRows, generic::GatedRows);
#endif
}

constexpr int64_t kRowsPerTask = 16, kSerialWork = 1 << 15;  // below kSerialWork values, one thread

struct Job {
  const float *x, *weight, *residual;
  float *sum, *out;
  int64_t T, K;
  bool gated;
  Activation act;
  float epsilon;
  LinearInput::GatedFn gated_rows;
};

void NormRow(const Job& job, int64_t t) {
  const int64_t K = job.K;
  const float* row = job.x + t * K;
  float* out = job.out + t * K;
  if (job.residual != nullptr) {  // x' = x + residual, kept in `sum` (else in out, normed in place)
    float* total = job.sum != nullptr ? job.sum + t * K : out;
    const float* r = job.residual + t * K;
    for (int64_t k = 0; k < K; ++k) total[k] = row[k] + r[k];
    row = total;
  }
  double squares = 0.0;  // as onnxruntime's SkipSimplifiedLayerNormalization sums them
  for (int64_t k = 0; k < K; ++k) squares += static_cast<double>(row[k]) * row[k];
  const float inv = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(K) + job.epsilon));
  for (int64_t k = 0; k < K; ++k) out[k] = row[k] * inv * job.weight[k];
}

void RunTask(void* data, size_t task) {
  const auto* job = static_cast<const Job*>(data);
  const int64_t t0 = static_cast<int64_t>(task) * kRowsPerTask, t1 = std::min(t0 + kRowsPerTask, job->T);
  if (job->gated) {
    job->gated_rows(job->x + t0 * 2 * job->K, job->out + t0 * job->K, t1 - t0, job->K, job->act);
    return;
  }
  for (int64_t t = t0; t < t1; ++t) NormRow(*job, t);
}

}  // namespace

LinearInput::LinearInput(const OrtApi* api, const OrtKernelInfo* info) {
  std::string gated;
  try {
    gated = Ort::ConstKernelInfo(info).GetAttribute<std::string>("gated");
  } catch (const std::exception&) {
    gated.clear();  // not set: x is the input itself
  }
  if (gated == "silu" || gated == "gelu_tanh") {
    gated_ = true;
    gated_rows_ = PickGated();
    act_ = gated == "silu" ? Activation::kSilu : Activation::kGeluTanh;
  } else if (!gated.empty()) {
    error_ = "attribute 'gated' must be 'silu' or 'gelu_tanh', got '" + gated + "'";
  }
  if (OrtStatus* st = api->KernelInfoGetAttribute_float(info, "norm_epsilon", &epsilon_)) {
    api->ReleaseStatus(st);
    epsilon_ = -1.0f;
  }
}

std::string LinearInput::Check(int64_t T, int64_t K, const Ort::Custom::Tensor<float>* norm_weight,
                               const Ort::Custom::Tensor<float>* residual, const Ort::Custom::Tensor<float>* sum) const {
  if (!error_.empty()) return error_;
  if (residual != nullptr && norm_weight == nullptr) return "residual needs norm_weight";
  if (sum != nullptr && residual == nullptr) return "output sum needs the residual input";
  if (norm_weight == nullptr) return {};
  if (gated_) return "gated and norm_weight cannot both be set";
  if (norm_weight->Shape() != std::vector<int64_t>{K})
    return "norm_weight must be [K] = [" + std::to_string(K) + "], got " + ShapeText(norm_weight->Shape());
  if (!(epsilon_ >= 0.0f)) return "attribute 'norm_epsilon' (>= 0) is required with norm_weight";
  if (residual != nullptr && residual->Shape() != std::vector<int64_t>{T, K})
    return "residual must be [T, K] = " + ShapeText({T, K}) + ", got " + ShapeText(residual->Shape());
  return {};
}

const float* LinearInput::Rows(Ort::KernelContext& ctx, const float* x, int64_t T, int64_t K,
                               const Ort::Custom::Tensor<float>* norm_weight,
                               const Ort::Custom::Tensor<float>* residual, Ort::Custom::Tensor<float>* sum,
                               std::string& error) const {
  error = Check(T, K, norm_weight, residual, sum);
  if (!error.empty()) return nullptr;
  if ((!gated_ && norm_weight == nullptr) || T == 0) {
    if (sum != nullptr) sum->Allocate({T, K});
    return x;
  }
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(T * K));
  Job job{x,       norm_weight != nullptr ? norm_weight->Data() : nullptr,
          residual != nullptr ? residual->Data() : nullptr,
          sum != nullptr ? sum->Allocate({T, K}) : nullptr,
          scratch.data(), T, K, gated_, act_, epsilon_, gated_rows_};
  const size_t tasks = static_cast<size_t>((T + kRowsPerTask - 1) / kRowsPerTask);
  if (tasks > 1 && T * K >= kSerialWork) {
    ctx.ParallelFor(RunTask, tasks, 0, &job);
  } else {
    for (size_t task = 0; task < tasks; ++task) RunTask(&job, task);
  }
  return scratch.data();
}

}  // namespace ortserve
