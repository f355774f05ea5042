// ortserve::PagedAttention (domain "ortserve"): query, key and value come separately (rotary
// already applied). See docs/design.md §1 and paged_attention_reference.py, the specification.
// PackedPagedAttention (paged_attention_packed.cc) takes the packed qkv projection instead.
#include "paged_attention.h"

#include <memory>

#include "paged_attention_core.h"

namespace {

using namespace ortserve;

struct PagedAttention {
  PagedAttention(const OrtApi* api, const OrtKernelInfo* info) : attrs_(api, info) {}

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& query, const Tensor<float>& key,
                      const Tensor<float>& value, const Tensor<float>& key_cache, const Tensor<float>& value_cache,
                      const Tensor<int64_t>& slot_mapping, const Tensor<int32_t>& block_tables,
                      const Tensor<int32_t>& context_lens, const Tensor<int32_t>& query_start_loc,
                      Tensor<float>& output, Tensor<float>& key_cache_out, Tensor<float>& value_cache_out) {
    try {
      Problem P{};
      std::string err = Validate(query, key, value, key_cache, value_cache, slot_mapping, block_tables,
                                 context_lens, query_start_loc, P);
      if (err.empty()) err = AliasCaches(key_cache, value_cache, key_cache_out, value_cache_out, P);
      if (!err.empty()) return OpError(err);
      P.out = output.Allocate({P.T, P.H * P.D});
      P.q = query.Data();
      // 1. Write the new key/value rows at their slots (in token order; -1 = skip).
      for (int64_t t = 0; t < P.T; ++t) {
        if (P.slots[t] < 0) continue;
        for (int64_t g = 0; g < P.KVH; ++g) {
          const int64_t row = CacheRowOffset(P, P.slots[t], g);
          WriteRow(P, P.kc + row, key.Data() + (t * P.KVH + g) * P.D);
          WriteRow(P, P.vc + row, value.Data() + (t * P.KVH + g) * P.D);
        }
      }
      // 2. Attention.
      Attend(context, P);
      return Ort::Status{nullptr};
    } catch (const std::exception& e) {
      return OpError(e.what());
    }
  }

 private:
  std::string Validate(const Tensor<float>& query, const Tensor<float>& key, const Tensor<float>& value,
                       const Tensor<float>& key_cache, const Tensor<float>& value_cache,
                       const Tensor<int64_t>& slot_mapping, const Tensor<int32_t>& block_tables,
                       const Tensor<int32_t>& context_lens, const Tensor<int32_t>& query_start_loc, Problem& P) {
    if (!attrs_.error.empty()) return attrs_.error;
    const auto &qs = query.Shape(), &ks = key.Shape(), &vs = value.Shape();
    if (qs.size() != 2 || qs[1] % attrs_.num_heads != 0)
      return "query must be [T, num_heads*head_size] with num_heads=" + std::to_string(attrs_.num_heads) + ", got " +
             ShapeStr(qs);
    P.T = qs[0], P.cache = CacheType::kF32;
    const std::string how = "query width " + std::to_string(qs[1]) + " / num_heads " + std::to_string(attrs_.num_heads);
    std::string err = SetHeads(attrs_, qs[1] / attrs_.num_heads, how, P);
    if (!err.empty()) return err;
    const std::vector<int64_t> kv_shape{P.T, P.KVH * P.D};
    if (ks != kv_shape) return "key must be [T, num_kv_heads*head_size] = " + ShapeStr(kv_shape) + ", got " + ShapeStr(ks);
    if (vs != kv_shape) return "value must be [T, num_kv_heads*head_size] = " + ShapeStr(kv_shape) + ", got " + ShapeStr(vs);
    return ValidateBatch(key_cache.Shape(), value_cache.Shape(), slot_mapping, block_tables, context_lens,
                         query_start_loc, P);
  }

  AttentionAttrs attrs_;
};

}  // namespace

namespace ortserve {

Ort::Custom::OrtLiteCustomOp* PagedAttentionOp() {
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op{
      Ort::Custom::CreateLiteCustomOp<PagedAttention>("PagedAttention", "CPUExecutionProvider", 1)};
  return op.get();
}

}  // namespace ortserve
