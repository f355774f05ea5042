// ortserve::PackedPagedAttention (domain "ortserve"): PagedAttention with the packed qkv projection
// in; the op does what were five to nine graph nodes a layer before it: split q/k/v, per-head RMS norm of
// q and k (Qwen3, Gemma 3), rotary on q and k, then the cache write and the attention of PagedAttention.
// Specification: paged_attention_packed() in paged_attention_reference.py.
//
// Inputs: qkv f32 [T, (H + 2 KVH) D] (q heads, then k heads, then v heads), key_cache, value_cache,
// slot_mapping, block_tables, context_lens, query_start_loc (as PagedAttention), then optional, in
// order: positions i64 [T], cos_cache / sin_cache f32 [max_positions, rotary_dim / 2] (rotary,
// non-interleaved, on the first rotary_dim of each head), q_norm / k_norm f32 [D]. Attributes as
// PagedAttention's, plus norm_epsilon (default 1e-6).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "paged_attention.h"
#include "paged_attention_core.h"

namespace {

using namespace ortserve;
using OptionalFloats = std::optional<const Tensor<float>*>;

// Per-token work before the attention: q heads (normed, rotated) into the output buffer, which the
// attention then reads as its query (each tile reads its own rows before it writes them); k heads
// (normed, rotated) and v heads straight into their cache slots.
struct Prologue {
  const Problem* P;
  const float* qkv;
  const int64_t* positions;
  const float *cos, *sin;  // [max_positions, half]; nullptr = no rotary
  int64_t half;
  const float *q_norm, *k_norm;  // [D]; nullptr = no norm
  float eps;
  float* q_out;  // [T, H, D]

  // y = rotary(rms_norm(x)): norm y = x / sqrt(mean(x^2) + eps) * w; rotary on pairs (i, i + half):
  // y_i = a cos_i - b sin_i, y_{i+half} = b cos_i + a sin_i.
  void Transform(const float* x, float* y, const float* norm, const float* c, const float* s) const {
    const int64_t D = P->D;
    if (norm) {
      float sum = 0.f;
      for (int64_t d = 0; d < D; ++d) sum += x[d] * x[d];
      const float denom = std::sqrt(sum / static_cast<float>(D) + eps);
      for (int64_t d = 0; d < D; ++d) y[d] = x[d] / denom * norm[d];
    } else if (x != y) {
      std::memcpy(y, x, D * sizeof(float));
    }
    if (!c) return;
    for (int64_t i = 0; i < half; ++i) {
      const float a = y[i], b = y[i + half];
      y[i] = a * c[i] - b * s[i];
      y[i + half] = b * c[i] + a * s[i];
    }
  }

  void Token(int64_t t) const {
    const Problem& p = *P;
    const float* row = qkv + t * (p.H + 2 * p.KVH) * p.D;
    const float* c = cos ? cos + positions[t] * half : nullptr;
    const float* s = cos ? sin + positions[t] * half : nullptr;
    for (int64_t h = 0; h < p.H; ++h) Transform(row + h * p.D, q_out + (t * p.H + h) * p.D, q_norm, c, s);
    if (p.slots[t] < 0) return;
    float key[kMaxHeadSize];
    for (int64_t g = 0; g < p.KVH; ++g) {
      const int64_t dst = CacheRowOffset(p, p.slots[t], g);
      Transform(row + (p.H + g) * p.D, key, k_norm, c, s);
      WriteRow(p, p.kc + dst, key);
      WriteRow(p, p.vc + dst, row + (p.H + p.KVH + g) * p.D);
    }
  }
};

constexpr int64_t kTokensPerTask = 8;

void RunPrologueTask(void* data, size_t task) {
  const auto* prologue = static_cast<const Prologue*>(data);
  const int64_t begin = static_cast<int64_t>(task) * kTokensPerTask;
  const int64_t end = std::min(begin + kTokensPerTask, prologue->P->T);
  for (int64_t t = begin; t < end; ++t) prologue->Token(t);
}

// One kernel per cache element type (float, half, int8 rows with their scale), registered under
// the same op name: ONNX Runtime picks the one whose input types match the graph's caches.
template <typename CacheT>
struct PackedPagedAttention {
  PackedPagedAttention(const OrtApi* api, const OrtKernelInfo* info) : attrs_(api, info) {
    if (OrtStatus* st = api->KernelInfoGetAttribute_float(info, "norm_epsilon", &eps_)) {
      api->ReleaseStatus(st);
      eps_ = 1e-6f;
    }
    if (!(eps_ > 0.f)) attrs_.error += "norm_epsilon must be > 0; ";
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& qkv, const Tensor<CacheT>& key_cache,
                      const Tensor<CacheT>& value_cache, const Tensor<int64_t>& slot_mapping,
                      const Tensor<int32_t>& block_tables, const Tensor<int32_t>& context_lens,
                      const Tensor<int32_t>& query_start_loc, std::optional<const Tensor<int64_t>*> positions,
                      OptionalFloats cos_cache, OptionalFloats sin_cache, OptionalFloats q_norm, OptionalFloats k_norm,
                      Tensor<float>& output, Tensor<CacheT>& key_cache_out, Tensor<CacheT>& value_cache_out) {
    try {
      Problem P{};
      Prologue pro{};
      std::string err = Validate(qkv, key_cache, value_cache, slot_mapping, block_tables, context_lens,
                                 query_start_loc, positions, cos_cache, sin_cache, q_norm, k_norm, P, pro);
      if (err.empty()) err = AliasCaches(key_cache, value_cache, key_cache_out, value_cache_out, P);
      if (!err.empty()) return OpError(err);
      P.out = output.Allocate({P.T, P.H * P.D});
      P.q = pro.q_out = P.out;
      pro.P = &P, pro.qkv = qkv.Data(), pro.eps = eps_;
      const size_t tasks = static_cast<size_t>((P.T + kTokensPerTask - 1) / kTokensPerTask);
      if (tasks > 1) {
        Ort::KernelContext(context).ParallelFor(RunPrologueTask, tasks, 0, &pro);
      } else if (tasks == 1) {
        RunPrologueTask(&pro, 0);
      }
      Attend(context, P);
      return Ort::Status{nullptr};
    } catch (const std::exception& e) {
      return OpError(e.what());
    }
  }

 private:
  std::string Validate(const Tensor<float>& qkv, const Tensor<CacheT>& key_cache, const Tensor<CacheT>& value_cache,
                       const Tensor<int64_t>& slot_mapping, const Tensor<int32_t>& block_tables,
                       const Tensor<int32_t>& context_lens, const Tensor<int32_t>& query_start_loc,
                       std::optional<const Tensor<int64_t>*> positions, OptionalFloats cos_cache,
                       OptionalFloats sin_cache, OptionalFloats q_norm, OptionalFloats k_norm, Problem& P,
                       Prologue& pro) {
    if (!attrs_.error.empty()) return attrs_.error;
    const auto& qs = qkv.Shape();
    const int64_t heads = attrs_.num_heads + 2 * attrs_.num_kv_heads;
    if (qs.size() != 2 || qs[1] % heads != 0)
      return "qkv must be [T, (num_heads + 2*num_kv_heads)*head_size] with num_heads=" +
             std::to_string(attrs_.num_heads) + ", num_kv_heads=" + std::to_string(attrs_.num_kv_heads) + ", got " +
             ShapeStr(qs);
    P.T = qs[0], P.cache = CacheTypeOf<CacheT>();
    const std::string how = "qkv width " + std::to_string(qs[1]) + " / " + std::to_string(heads) + " heads";
    std::string err = SetHeads(attrs_, qs[1] / heads, how, P);
    if (!err.empty()) return err;
    err = ValidateBatch(key_cache.Shape(), value_cache.Shape(), slot_mapping, block_tables, context_lens,
                        query_start_loc, P);
    if (!err.empty()) return err;
    if (cos_cache.has_value()) {
      if (!positions.has_value()) return "cos_cache needs positions";
      if (!sin_cache.has_value()) return "cos_cache needs sin_cache";
      const auto &cs = (*cos_cache)->Shape(), &ss = (*sin_cache)->Shape(), &ps = (*positions)->Shape();
      if (cs.size() != 2 || cs[1] < 1 || 2 * cs[1] > P.D)
        return "cos_cache must be [max_positions, rotary_dim/2] with rotary_dim <= head_size " + std::to_string(P.D) +
               ", got " + ShapeStr(cs);
      if (ss != cs) return "sin_cache shape " + ShapeStr(ss) + " differs from cos_cache shape " + ShapeStr(cs);
      if (ps != std::vector<int64_t>{P.T}) return "positions must be [T] = [" + std::to_string(P.T) + "], got " + ShapeStr(ps);
      const int64_t* pos = (*positions)->Data();
      for (int64_t t = 0; t < P.T; ++t)
        if (pos[t] < 0 || pos[t] >= cs[0])
          return "positions[" + std::to_string(t) + "] = " + std::to_string(pos[t]) + " is outside the rotary tables " +
                 "(max_positions = " + std::to_string(cs[0]) + ")";
      pro.positions = pos, pro.cos = (*cos_cache)->Data(), pro.sin = (*sin_cache)->Data(), pro.half = cs[1];
    }
    for (auto [norm, name, out] : {std::tuple{q_norm, "q_norm", &pro.q_norm}, std::tuple{k_norm, "k_norm", &pro.k_norm}}) {
      if (!norm.has_value()) continue;
      if ((*norm)->Shape() != std::vector<int64_t>{P.D})
        return std::string(name) + " must be [head_size] = [" + std::to_string(P.D) + "], got " + ShapeStr((*norm)->Shape());
      *out = (*norm)->Data();
    }
    return {};
  }

  AttentionAttrs attrs_;
  float eps_ = 1e-6f;
};

}  // namespace

namespace ortserve {

std::vector<Ort::Custom::OrtLiteCustomOp*> PackedPagedAttentionOps() {
  using Ort::Custom::CreateLiteCustomOp;
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> f32{
      CreateLiteCustomOp<PackedPagedAttention<float>>("PackedPagedAttention", "CPUExecutionProvider", 1)};
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> f16{
      CreateLiteCustomOp<PackedPagedAttention<Ort::Float16_t>>("PackedPagedAttention", "CPUExecutionProvider", 1)};
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> i8{
      CreateLiteCustomOp<PackedPagedAttention<int8_t>>("PackedPagedAttention", "CPUExecutionProvider", 1)};
  return {f32.get(), f16.get(), i8.get()};
}

}  // namespace ortserve
