// See block_offsets.h.
#include "block_offsets.h"

#include "isa.h"

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace ortserve;
using Ort::Custom::Tensor;
using SumsFn = void (*)(const float*, float*, int64_t, int64_t, int64_t);
using ColumnsFn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t,
                           int64_t);
using HalfColumnsFn = void (*)(const float*, const float*, const uint16_t*, float*, int64_t, int64_t, int64_t,
                               int64_t, int64_t);
using HalfRowsFn = void (*)(const uint16_t*, float*, int64_t);

struct Kernels {
  SumsFn sums;
  ColumnsFn columns;
  HalfColumnsFn half_columns;
  HalfRowsFn half_rows;
};

Kernels PickKernels() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return {generic::BlockSums, generic::AddOffsetColumns, generic::AddHalfOffsetColumns, generic::HalfRowsToFloats};
#else
  return {PickBuild<SumsFn>(avx512::BlockSums, avx2::BlockSums, generic::BlockSums),
          PickBuild<ColumnsFn>(avx512::AddOffsetColumns, avx2::AddOffsetColumns, generic::AddOffsetColumns),
          PickBuild<HalfColumnsFn>(avx512::AddHalfOffsetColumns, avx2::AddHalfOffsetColumns,
                                   generic::AddHalfOffsetColumns),
          PickBuild<HalfRowsFn>(avx512::HalfRowsToFloats, avx2::HalfRowsToFloats, generic::HalfRowsToFloats)};
#endif
}

// A task is a tile of rows x columns: decode (one row) splits over columns, in wider tiles so each
// offsets row is read in long runs, a prefill chunk over both.
// Below kSerialWork multiply-adds the whole op runs on the calling thread: waking the pool costs more
// (decode of a 576-wide model: 10.9 us on 2 threads, 7.6 us on one, for [18, 960] offsets).
constexpr int64_t kColumnsPerTask = 256, kRowsPerTask = 64, kSerialWork = 32768;
constexpr int64_t kDecodeRows = 4, kDecodeColumnsPerTask = 512;

// out = y + sums @ offsets over one tile; fp16 offsets (half) are read as they are for up to one
// tile of rows (decode batches) and converted to floats once (offsets) for a longer prefill chunk.
struct Job {
  const float *y, *sums, *offsets;
  const uint16_t* half;
  float* out;
  int64_t T, nb, N;
  const Kernels* kernels;
  int64_t width = T <= kDecodeRows ? kDecodeColumnsPerTask : kColumnsPerTask;  // columns per task

  int64_t ColumnTiles() const { return (N + width - 1) / width; }
  size_t Tasks() const { return static_cast<size_t>(ColumnTiles() * ((T + kRowsPerTask - 1) / kRowsPerTask)); }
};

void RunTask(void* data, size_t task) {
  const auto* job = static_cast<const Job*>(data);
  const int64_t tile = static_cast<int64_t>(task);
  const int64_t t0 = tile / job->ColumnTiles() * kRowsPerTask, rows = std::min(kRowsPerTask, job->T - t0);
  const int64_t n0 = tile % job->ColumnTiles() * job->width, n1 = std::min(n0 + job->width, job->N);
  const float *y = job->y + t0 * job->N, *sums = job->sums + t0 * job->nb;
  float* out = job->out + t0 * job->N;
  if (job->offsets != nullptr)
    job->kernels->columns(y, sums, job->offsets, out, rows, job->nb, job->N, n0, n1);
  else
    job->kernels->half_columns(y, sums, job->half, out, rows, job->nb, job->N, n0, n1);
}

template <typename OffsetT>
struct AddBlockOffsets {
  static_assert(std::is_same_v<OffsetT, float> || std::is_same_v<OffsetT, Ort::Float16_t>);

  AddBlockOffsets(const OrtApi* api, const OrtKernelInfo* info) {
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, "block_size", &block_size_)) {
      api->ReleaseStatus(st);
      block_size_ = 0;
    }
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& x, const Tensor<float>& y,
                      const Tensor<OffsetT>& offsets, Tensor<float>& out) {
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
    // block sums of x, then out = y + sums @ offsets, parallel over tiles of rows x columns
    std::vector<float> sums(static_cast<size_t>(T * nb));
    kernels_.sums(x.Data(), sums.data(), T, xs[1], block_size_);
    float* result = out.Allocate({T, N});
    Job job{y.Data(), sums.data(), nullptr, nullptr, result, T, nb, N, &kernels_};
    std::vector<float> converted;
    if constexpr (std::is_same_v<OffsetT, float>) {
      job.offsets = offsets.Data();
    } else if (T <= kRowsPerTask) {  // decode batches: read the halves once, as they stream
      job.half = reinterpret_cast<const uint16_t*>(offsets.Data());
    } else {
      converted.resize(static_cast<size_t>(nb * N));
      kernels_.half_rows(reinterpret_cast<const uint16_t*>(offsets.Data()), converted.data(), nb * N);
      job.offsets = converted.data();
    }
    const size_t tasks = job.Tasks();
    if (tasks > 1 && T * nb * N >= kSerialWork) {
      Ort::KernelContext(context).ParallelFor(RunTask, tasks, 0, &job);
    } else {
      for (size_t task = 0; task < tasks; ++task) RunTask(&job, task);
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
  Kernels kernels_ = PickKernels();
};

}  // namespace

namespace ortserve {

std::vector<Ort::Custom::OrtLiteCustomOp*> AddBlockOffsetsOps() {
  using Ort::Custom::CreateLiteCustomOp;
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> f32{
      CreateLiteCustomOp<AddBlockOffsets<float>>("AddBlockOffsets", "CPUExecutionProvider", 1)};
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> f16{
      CreateLiteCustomOp<AddBlockOffsets<Ort::Float16_t>>("AddBlockOffsets", "CPUExecutionProvider", 1)};
  return {f32.get(), f16.get()};
}

}  // namespace ortserve
