// See gated_activation.h.
#include "gated_activation.h"

#include "isa.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace ortserve;
using Ort::Custom::Tensor;
using RowsFn = void (*)(const float*, float*, int64_t, int64_t, Activation);

RowsFn PickKernel() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return generic::GatedRows;
#else
  return PickBuild<RowsFn>(avx512::GatedRows, avx2::GatedRows, generic::GatedRows);
#endif
}

constexpr int64_t kRowsPerTask = 4;

struct Job {
  const float* x;
  float* y;
  int64_t rows, inner;
  Activation act;
  RowsFn run;
};

void RunTask(void* data, size_t task) {
  const auto* job = static_cast<const Job*>(data);
  const int64_t begin = static_cast<int64_t>(task) * kRowsPerTask;
  const int64_t end = std::min(begin + kRowsPerTask, job->rows);
  job->run(job->x + begin * 2 * job->inner, job->y + begin * job->inner, end - begin, job->inner, job->act);
}

struct GatedActivation {
  GatedActivation(const OrtApi* api, const OrtKernelInfo* info) {
    std::string name;
    try {
      name = Ort::ConstKernelInfo(info).GetAttribute<std::string>("activation");
    } catch (const std::exception&) {
      error_ = "attribute 'activation' is required ('silu' or 'gelu_tanh')";
    }
    (void)api;
    if (name == "silu") {
      act_ = Activation::kSilu;
    } else if (name == "gelu_tanh") {
      act_ = Activation::kGeluTanh;
    } else if (error_.empty()) {
      error_ = "activation must be 'silu' or 'gelu_tanh', got '" + name + "'";
    }
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& x, Tensor<float>& y) {
    if (!error_.empty()) return Error(error_);
    const std::vector<int64_t>& shape = x.Shape();
    if (shape.size() != 2 || shape[1] % 2 != 0)
      return Error("x must be [T, 2*I] (gate then up), got rank " + std::to_string(shape.size()) +
                   (shape.size() == 2 ? " with an odd width " + std::to_string(shape[1]) : std::string()));
    Job job{x.Data(), nullptr, shape[0], shape[1] / 2, act_, PickKernel()};
    job.y = y.Allocate({job.rows, job.inner});
    const size_t tasks = static_cast<size_t>((job.rows + kRowsPerTask - 1) / kRowsPerTask);
    if (tasks > 1) {
      Ort::KernelContext(context).ParallelFor(RunTask, tasks, 0, &job);
    } else if (tasks == 1) {
      RunTask(&job, 0);
    }
    return Ort::Status{nullptr};
  }

  static Ort::Status Error(const std::string& msg) {
    return Ort::Status(("GatedActivation: " + msg).c_str(), ORT_INVALID_ARGUMENT);
  }

  Activation act_ = Activation::kSilu;
  std::string error_;
};

}  // namespace

namespace ortserve {

Ort::Custom::OrtLiteCustomOp* GatedActivationOp() {
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op{
      Ort::Custom::CreateLiteCustomOp<GatedActivation>("GatedActivation", "CPUExecutionProvider", 1)};
  return op.get();
}

}  // namespace ortserve
