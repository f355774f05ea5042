// See matmul_q.h.
#include "matmul_q.h"

#include "isa.h"
#include "linear_input.h"
#include "op_util.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace ortserve;
using Ort::Custom::Tensor;
using QuantizeFn = void (*)(const float*, int64_t, int64_t, bool, int8_t*, float*, float*);
using AdaptFn = void (*)(int, int8_t*, int64_t);
using TileFn = void (*)(int, const uint8_t*, const void*, bool, bool, const int8_t*, const float*, const float*,
                        const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);

struct Kernels {
  QuantizeFn quantize;
  AdaptFn adapt;
  TileFn tile;
};

Kernels PickKernels() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return {generic::QuantizeRows, generic::AdaptRows, generic::QTile};
#else
  return {PickBuild<QuantizeFn>(avx512::QuantizeRows, avx2::QuantizeRows, generic::QuantizeRows),
          PickBuild<AdaptFn>(avx512::AdaptRows, avx2::AdaptRows, generic::AdaptRows),
          PickBuild<TileFn>(avx512::QTile, avx2::QTile, generic::QTile)};
#endif
}

// A task is a tile of int8 activation rows (two per row of x with 16-bit activations) x weight groups.
// Up to kWholeRows rows (decode batches) stay in one tile, so every weight is read once per call, and
// the groups split evenly over about 4 tasks a CPU; longer chunks (prefill) take tiles of kRowsPerTask rows x
// kGroupsPerTask groups, whose codes stay in cache while the rows pass (in a build with kRowsOuter, a
// tile of rows at a time stays in L1 while the task's groups pass). Below kSerialWork
// weight bytes x rows the calling thread does it all: waking the pool costs more.
constexpr int64_t kWholeRows = 32, kRowsPerTask = 64, kGroupsPerTask = 8, kSerialWork = 1 << 16;

struct Job {
  int bits;
  const uint8_t* codes;
  const void* scales;
  bool half, residual;
  int8_t* xq;
  float *xs, *halves;  // halves: MatMulQ2K's, else nullptr
  const float *x, *bias;
  float* y;
  int64_t T, K, KB, N, G;
  int64_t rows_per_task;
  EvenTiles group_tiles;
  const Kernels* kernels;

  int64_t Rows() const { return residual ? 2 * T : T; }  // int8 rows
  size_t Tasks() const { return static_cast<size_t>(group_tiles.count * ((Rows() + rows_per_task - 1) / rows_per_task)); }
};

void RunTask(void* data, size_t task) {
  const auto* job = static_cast<const Job*>(data);
  const int64_t tile = static_cast<int64_t>(task), group_tile = tile % job->group_tiles.count;
  const int64_t t0 = tile / job->group_tiles.count * job->rows_per_task;
  const int64_t t1 = std::min(t0 + job->rows_per_task, job->Rows());
  const int64_t g0 = job->group_tiles.Begin(group_tile), g1 = job->group_tiles.End(group_tile);
  job->kernels->tile(job->bits, job->codes, job->scales, job->half, job->residual, job->xq, job->xs, job->halves,
                     job->bias, job->y, job->KB, job->N, t0, t1, g0, g1);
}

void QuantizeTask(void* data, size_t task) {
  const auto* job = static_cast<const Job*>(data);
  const int64_t t0 = static_cast<int64_t>(task) * kRowsPerTask, rows = std::min(kRowsPerTask, job->T - t0);
  const int64_t r0 = job->residual ? 2 * t0 : t0;
  int8_t* xq = job->xq + r0 * job->KB * kQBlock;
  job->kernels->quantize(job->x + t0 * job->K, rows, job->K, job->residual, xq, job->xs + r0 * job->KB * 2,
                         job->halves ? job->halves + r0 * job->KB * 2 : nullptr);
  job->kernels->adapt(job->bits, xq, (job->residual ? 2 : 1) * rows * job->KB * kQBlock);
}

template <int Bits, typename ScaleT>
struct MatMulQ {
  static_assert(std::is_same_v<ScaleT, float> || std::is_same_v<ScaleT, Ort::Float16_t>);
  static constexpr int64_t kBlockBytes = kQBlockBytesOf<Bits>;

  MatMulQ(const OrtApi* api, const OrtKernelInfo* info)
      : N_(IntAttribute(api, info, "N", 0)),
        K_(IntAttribute(api, info, "K", 0)),  // optional: checks x
        activation_bits_(IntAttribute(api, info, "activation_bits", 8)),
        codes_copy_(CopyOfConstantInput(info, 1)),
        scales_copy_(CopyOfConstantInput(info, 2)),
        input_(api, info) {}

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& x, const Tensor<uint8_t>& codes,
                      const Tensor<ScaleT>& scales, std::optional<const Tensor<float>*> bias,
                      std::optional<const Tensor<float>*> norm_weight, std::optional<const Tensor<float>*> residual_input,
                      Tensor<float>& y, std::optional<Tensor<float>*> sum) {
    if (N_ <= 0) return Error("attribute 'N' (the weight's rows) is required and must be > 0, got " + std::to_string(N_));
    if (activation_bits_ != 8 && activation_bits_ != 16)
      return Error("attribute 'activation_bits' must be 8 or 16, got " + std::to_string(activation_bits_));
    const std::vector<int64_t>&xs = x.Shape(), &cs = codes.Shape(), &ss = scales.Shape();
    const int64_t wide = input_.Gated() ? 2 : 1;  // x is [T, 2K] when gated
    if (xs.size() != 2 || xs[1] <= 0 || xs[1] % wide != 0 || (K_ > 0 && xs[1] != input_.Width(K_)))
      return Error("x must be [T, " + std::string(input_.Gated() ? "2K" : "K") +
                   (K_ > 0 ? " = " + std::to_string(input_.Width(K_)) : std::string(" > 0")) + "], got " + ShapeText(xs));
    const int64_t T = xs[0], K = xs[1] / wide, KB = (K + kQBlock - 1) / kQBlock, G = (N_ + kQGroup - 1) / kQGroup;
    if (cs != std::vector<int64_t>{G, KB, kBlockBytes})
      return Error("codes must be [ceil(N / 16), ceil(K / 32), " + std::to_string(kBlockBytes) +
                   "] = " + ShapeText({G, KB, kBlockBytes}) +
                   " for N = " + std::to_string(N_) + ", K = " + std::to_string(K) + ", got " + ShapeText(cs));
    if (ss != QScalesShape(Bits, G, KB))
      return Error("scales must be " + ShapeText(QScalesShape(Bits, G, KB)) + ", got " + ShapeText(ss));
    const float* bias_data = nullptr;
    if (const Tensor<float>* b = Present(bias)) {
      if (b->Shape() != std::vector<int64_t>{N_})
        return Error("bias must be [N] = [" + std::to_string(N_) + "] (or [0]: none), got " + ShapeText(b->Shape()));
      bias_data = b->Data();
    }
    Ort::KernelContext ctx(context);
    std::string error;
    const float* rows_in = input_.Rows(ctx, x.Data(), T, K, Present(norm_weight), Present(residual_input),
                                       sum.has_value() ? *sum : nullptr, error);
    if (!error.empty()) return Error(error);
    float* out = y.Allocate({T, N_});
    if (T == 0) return Ort::Status{nullptr};

    // x to int8 blocks (per-thread scratch, reused across calls), then the tiles
    const bool residual = activation_bits_ == 16;
    const int64_t rows = residual ? 2 * T : T;
    thread_local std::vector<int8_t> xq;
    thread_local std::vector<float> xscales, halves;
    xq.resize(static_cast<size_t>(rows * KB * kQBlock));
    xscales.resize(static_cast<size_t>(rows * KB * 2));
    if constexpr (kQSub16MinsOf<Bits>) halves.resize(static_cast<size_t>(rows * KB * 2));
    const bool decode = rows <= kWholeRows;
    const uint8_t* codes_data = codes_copy_ ? codes_copy_.get() : codes.Data();
    const void* scales_data = scales_copy_ ? static_cast<const void*>(scales_copy_.get()) : scales.Data();
    Job job{Bits, codes_data, scales_data, std::is_same_v<ScaleT, Ort::Float16_t>, residual, xq.data(), xscales.data(),
            kQSub16MinsOf<Bits> ? halves.data() : nullptr, rows_in, bias_data, out, T, K, KB, N_, G, decode ? rows : kRowsPerTask,
            decode ? DecodeTiles(G) : TilesOf(G, kGroupsPerTask), &kernels_};
    const bool serial = rows * G * KB * kBlockBytes < kSerialWork;
    const size_t row_tasks = static_cast<size_t>((T + kRowsPerTask - 1) / kRowsPerTask);
    if (serial || row_tasks == 1) {
      for (size_t task = 0; task < row_tasks; ++task) QuantizeTask(&job, task);
    } else {
      ctx.ParallelFor(QuantizeTask, row_tasks, 0, &job);
    }
    const size_t tasks = job.Tasks();
    if (serial || tasks == 1) {
      for (size_t task = 0; task < tasks; ++task) RunTask(&job, task);
    } else {
      ctx.ParallelFor(RunTask, tasks, 0, &job);
    }
    return Ort::Status{nullptr};
  }

  static Ort::Status Error(const std::string& msg) {
    return Ort::Status(("MatMulQ" + QSuffix(Bits) + ": " + msg).c_str(), ORT_INVALID_ARGUMENT);
  }

  int64_t N_, K_, activation_bits_;
  // the weights in our own memory when they are initializers (CopyOfConstantInput), else read per call
  std::shared_ptr<const uint8_t> codes_copy_, scales_copy_;
  LinearInput input_;  // the norm or gated activation before the product, if any
  Kernels kernels_ = PickKernels();
};

}  // namespace

namespace ortserve {

std::vector<Ort::Custom::OrtLiteCustomOp*> MatMulQOps() { return QuantizedKernels<MatMulQ>("MatMulQ"); }

}  // namespace ortserve
