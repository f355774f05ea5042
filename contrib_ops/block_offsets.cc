// See block_offsets.h.
#include "block_offsets.h"

#include "isa.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace ortserve;
using Ort::Custom::Tensor;
using ColumnsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);

ColumnsFn PickKernel() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return generic::AddOffsetColumns;
#else
  return PickBuild<ColumnsFn>(avx512::AddOffsetColumns, avx2::AddOffsetColumns, generic::AddOffsetColumns);
#endif
}

constexpr int64_t kColumnsPerTask = 256;

struct Job {
  const float *sums, *offsets;
  float* out;
  int64_t T, nb, N;
  ColumnsFn run;
};

void RunTask(void* data, size_t task) {
  const auto* job = static_cast<const Job*>(data);
  const int64_t n0 = static_cast<int64_t>(task) * kColumnsPerTask, n1 = std::min(n0 + kColumnsPerTask, job->N);
  job->run(job->sums, job->offsets, job->out, job->T, job->nb, job->N, n0, n1);
}

struct AddBlockOffsets {
  AddBlockOffsets(const OrtApi* api, const OrtKernelInfo* info) {
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, "block_size", &block_size_)) {
      api->ReleaseStatus(st);
      block_size_ = 0;
    }
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& x, const Tensor<float>& y,
                      const Tensor<float>& offsets, Tensor<float>& out) {
    if (block_size_ <= 0)
      return Error("attribute 'block_size' is required and must be > 0 (got " + std::to_string(block_size_) + ")");
    const std::vector<int64_t>&xs = x.Shape(), &ys = y.Shape(), &os = offsets.Shape();
    if (xs.size() != 2 || xs[1] % block_size_ != 0)
      return Error("x must be [T, K] with K a multiple of block_size " + std::to_string(block_size_) + ", got " +
                   Shape(xs));
    const int64_t T = xs[0], nb = xs[1] / block_size_;
    if (os.size() != 2 || os[0] != nb)
      return Error("offsets must be [K / block_size = " + std::to_string(nb) + ", N], got " + Shape(os));
    const int64_t N = os[1];
    if (ys != std::vector<int64_t>{T, N}) return Error("y must be [T, N] = [" + std::to_string(T) + ", " +
                                                       std::to_string(N) + "], got " + Shape(ys));
    // block sums of x, then out = y + sums @ offsets, parallel over columns
    std::vector<float> sums(static_cast<size_t>(T * nb));
    const float* in = x.Data();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < nb; ++b) {
        float s = 0.f;
        for (int64_t i = 0; i < block_size_; ++i) s += in[t * xs[1] + b * block_size_ + i];
        sums[t * nb + b] = s;
      }
    float* result = out.Allocate({T, N});
    std::memcpy(result, y.Data(), sizeof(float) * static_cast<size_t>(T * N));
    Job job{sums.data(), offsets.Data(), result, T, nb, N, PickKernel()};
    const size_t tasks = static_cast<size_t>((N + kColumnsPerTask - 1) / kColumnsPerTask);
    if (T > 0 && tasks > 1) {
      Ort::KernelContext(context).ParallelFor(RunTask, tasks, 0, &job);
    } else if (T > 0 && tasks == 1) {
      RunTask(&job, 0);
    }
    return Ort::Status{nullptr};
  }

  static std::string Shape(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }

  static Ort::Status Error(const std::string& msg) {
    return Ort::Status(("AddBlockOffsets: " + msg).c_str(), ORT_INVALID_ARGUMENT);
  }

  int64_t block_size_ = 0;
};

}  // namespace

namespace ortserve {

Ort::Custom::OrtLiteCustomOp* AddBlockOffsetsOp() {
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op{
      Ort::Custom::CreateLiteCustomOp<AddBlockOffsets>("AddBlockOffsets", "CPUExecutionProvider", 1)};
  return op.get();
}

}  // namespace ortserve
