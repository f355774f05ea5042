// See matmul_f.h.
#include "matmul_f.h"

#include "isa.h"
#include "linear_input.h"
#include "matmul_f_kernel.h"
#include "op_util.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace ortserve;
using Ort::Custom::Tensor;
using TileFn = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t,
                        int64_t, int);
using PackFn = void (*)(const float*, int64_t, int64_t, float*);

struct Kernels {  // of one build: its panel layout is its own (matmul_f_kernel.h)
  PackFn pack;
  TileFn tile;
  int row_streams;  // the AVX-512 build's streams a panel for one row of x
};

// A Zen 4 reads a decode step's weights fastest as one stream a panel (1.1-1.5x the 2, 4 or 8 streams
// that an Intel Xeon's prefetchers want: benchmarks/tables/amd_epyc_zen4.md); $ORTSERVE_F_ROW_STREAMS=1|8
// overrides the choice (the tests run both).
int RowStreams() {
  const char* want = std::getenv("ORTSERVE_F_ROW_STREAMS");
  if (want && *want) return std::string(want) == "1" ? 1 : 8;
  return IsAmdZen4() ? 1 : 8;
}

Kernels PickKernels() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return {generic::FPack, generic::FTile, 1};
#else
  return {PickBuild<PackFn>(avx512::FPack, avx2::FPack, generic::FPack),
          PickBuild<TileFn>(avx512::FTile, avx2::FTile, generic::FTile), RowStreams()};
#endif
}

struct Packed {
  std::shared_ptr<const float> panels;
  int64_t N = 0, K = 0;
};

// The constant W of the node, packed into 64-byte aligned memory of the op's own (which the engine
// collapses into huge pages, as MatMulQ's copies), onnxruntime's pages of it released
// (ReleaseSourcePages); empty when W is not a constant.
Packed PackConstant(const OrtKernelInfo* info, PackFn pack) {
  try {
    int is_constant = 0;
    Ort::ConstValue value = Ort::ConstKernelInfo(info).GetTensorConstantInput(1, &is_constant);
    if (!is_constant || value == nullptr) return {};
    const auto info_w = value.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = info_w.GetShape();
    if (info_w.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || shape.size() != 2) return {};
    const int64_t N = shape[0], K = shape[1];
    const size_t bytes = static_cast<size_t>(PackedFloats(N, K)) * sizeof(float);
    void* memory = bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
    if (memory == nullptr) return {};
    pack(value.GetTensorData<float>(), N, K, static_cast<float*>(memory));
    ReleaseSourcePages(value.GetTensorData<float>(), static_cast<size_t>(N * K) * sizeof(float));
    return {{static_cast<const float*>(memory), [](const float* p) { std::free(const_cast<float*>(p)); }}, N, K};
  } catch (const Ort::Exception&) {
    return {};  // not available: pack per call
  }
}

// A task is a tile of rows x panels. Up to kRowsPerTask rows (decode batches, short chunks) stay in one
// tile, so every weight is read once per call, and the panels split evenly over about 4 tasks a CPU; longer
// chunks (prefill) take tiles of kRowsPerTask rows x kPanelsPerTask panels, each panel reused from
// cache by every row of its tile. Below kSerialWork multiply-adds the calling thread does it all.
constexpr int64_t kRowsPerTask = 64, kPanelsPerTask = 8, kSerialWork = 1 << 16;

struct Job {
  const float *x, *panels, *bias;
  float* y;
  int64_t T, K, N;
  EvenTiles panel_tiles;
  TileFn tile;
  int row_streams;

  size_t Tasks() const { return static_cast<size_t>(panel_tiles.count * ((T + kRowsPerTask - 1) / kRowsPerTask)); }
};

void RunTask(void* data, size_t task) {
  const auto* job = static_cast<const Job*>(data);
  const int64_t index = static_cast<int64_t>(task);
  const int64_t tiles = job->panel_tiles.count, panel_tile = index % tiles;
  const int64_t t0 = index / tiles * kRowsPerTask, t1 = std::min(t0 + kRowsPerTask, job->T);
  job->tile(job->x, job->K, job->panels, job->bias, job->y, job->N, t0, t1, job->panel_tiles.Begin(panel_tile),
            job->panel_tiles.End(panel_tile), job->row_streams);
}

struct MatMulF {
  MatMulF(const OrtApi* api, const OrtKernelInfo* info) : packed_(PackConstant(info, kernels_.pack)), input_(api, info) {}

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& x, const Tensor<float>& w,
                      std::optional<const Tensor<float>*> bias, std::optional<const Tensor<float>*> norm_weight,
                      std::optional<const Tensor<float>*> residual, Tensor<float>& y,
                      std::optional<Tensor<float>*> sum) {
    const std::vector<int64_t>&xs = x.Shape(), &ws = w.Shape();
    if (ws.size() != 2 || ws[0] <= 0 || ws[1] <= 0) return Error("W must be [N, K] with N, K > 0, got " + ShapeText(ws));
    const int64_t N = ws[0], K = ws[1], width = input_.Width(K);
    if (xs.size() != 2 || xs[1] != width)
      return Error("x must be [T, " + std::string(input_.Gated() ? "2K" : "K") + " = " + std::to_string(width) + "], got " +
                   ShapeText(xs));
    const float* bias_data = nullptr;
    if (const Tensor<float>* b = Present(bias)) {
      if (b->Shape() != std::vector<int64_t>{N})
        return Error("bias must be [N] = [" + std::to_string(N) + "] (or [0]: none), got " + ShapeText(b->Shape()));
      bias_data = b->Data();
    }
    const int64_t T = xs[0];
    Ort::KernelContext ctx(context);
    std::string error;
    const float* rows = input_.Rows(ctx, x.Data(), T, K, Present(norm_weight), Present(residual),
                                    sum.has_value() ? *sum : nullptr, error);
    if (!error.empty()) return Error(error);
    float* out = y.Allocate({T, N});
    if (T == 0) return Ort::Status{nullptr};

    const float* panels = packed_.panels.get();
    thread_local std::vector<float> per_call;  // a W that is not a constant
    if (panels == nullptr) {
      per_call.resize(static_cast<size_t>(PackedFloats(N, K)));
      kernels_.pack(w.Data(), N, K, per_call.data());
      panels = per_call.data();
    }
    const int64_t P = FPanels(N);
    Job job{rows, panels, bias_data, out, T, K, N, T <= kRowsPerTask ? DecodeTiles(P) : TilesOf(P, kPanelsPerTask),
            kernels_.tile, kernels_.row_streams};
    const size_t tasks = job.Tasks();
    if (T * K * N < kSerialWork || tasks == 1) {
      for (size_t task = 0; task < tasks; ++task) RunTask(&job, task);
    } else {
      ctx.ParallelFor(RunTask, tasks, 0, &job);
    }
    return Ort::Status{nullptr};
  }

  static Ort::Status Error(const std::string& msg) { return Ort::Status(("MatMulF: " + msg).c_str(), ORT_INVALID_ARGUMENT); }

  Kernels kernels_ = PickKernels();  // before packed_, which packs with it
  Packed packed_;
  LinearInput input_;  // the norm or gated activation before the product, if any
};

}  // namespace

namespace ortserve {

Ort::Custom::OrtLiteCustomOp* MatMulFOp() {
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op{
      Ort::Custom::CreateLiteCustomOp<MatMulF>("MatMulF", "CPUExecutionProvider", 1)};
  return op.get();
}

}  // namespace ortserve
