// ortserve::PagedAttention (domain "ortserve", version 1): see DESIGN.md §1 and
// paged_attention_reference.py, which is the specification this kernel matches.
#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Ort::Custom::Tensor;

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Everything the attention loop needs, validated.
struct Problem {
  int64_t T, H, KVH, D, group, num_blocks, block_size, B, max_blocks;
  float scale, softcap;
  int64_t window;  // 0 = none
  const float* q;
  float* out;
  float* kc;
  float* vc;
  const int32_t* block_tables;
  const int32_t* context_lens;
  const int32_t* qsl;
};

// One unit of parallel work: query rows [row_begin, row_end) of sequence seq, one kv head.
struct WorkItem {
  int32_t seq, kv_head, row_begin, row_end;
};

// Scalar online softmax of one query head over cached positions [lo, hi].
void AttendRow(const Problem& P, int64_t seq, int64_t kv_head, const float* q, int64_t lo, int64_t hi,
               float* out) {
  const int32_t* table = P.block_tables + seq * P.max_blocks;
  float m = -std::numeric_limits<float>::infinity(), l = 0.f;
  std::vector<float> acc(P.D, 0.f);
  for (int64_t j = lo; j <= hi; ++j) {
    const int64_t row = (table[j / P.block_size] * P.KVH + kv_head) * P.block_size + j % P.block_size;
    const float* k = P.kc + row * P.D;
    const float* v = P.vc + row * P.D;
    float s = 0.f;
    for (int64_t d = 0; d < P.D; ++d) s += q[d] * k[d];
    s *= P.scale;
    if (P.softcap > 0.f) s = P.softcap * std::tanh(s / P.softcap);  // s = c * tanh(s / c)
    const float m_new = std::max(m, s);
    const float alpha = std::exp(m - m_new);  // rescale of the old running sum and accumulator
    const float p = std::exp(s - m_new);
    l = l * alpha + p;
    for (int64_t d = 0; d < P.D; ++d) acc[d] = acc[d] * alpha + p * v[d];
    m = m_new;
  }
  for (int64_t d = 0; d < P.D; ++d) out[d] = acc[d] / l;
}

void RunWorkItem(const Problem& P, const WorkItem& w) {
  const int64_t qs = P.qsl[w.seq], q_len = P.qsl[w.seq + 1] - qs, ctx = P.context_lens[w.seq];
  for (int64_t i = w.row_begin; i < w.row_end; ++i) {
    const int64_t p = ctx - q_len + (i - qs);  // absolute position of query row i
    const int64_t lo = P.window > 0 ? std::max<int64_t>(0, p - P.window + 1) : 0;
    for (int64_t h = w.kv_head * P.group; h < (w.kv_head + 1) * P.group; ++h) {
      const float* q = P.q + (i * P.H + h) * P.D;
      AttendRow(P, w.seq, w.kv_head, q, lo, p, P.out + (i * P.H + h) * P.D);
    }
  }
}

struct ParallelData {
  const Problem* problem;
  const std::vector<WorkItem>* items;
};

void RunWorkItemTask(void* data, size_t index) {
  auto* d = static_cast<ParallelData*>(data);
  RunWorkItem(*d->problem, (*d->items)[index]);
}

struct PagedAttention {
  PagedAttention(const OrtApi* api, const OrtKernelInfo* info) {
    auto get_int = [&](const char* name, int64_t fallback, bool required) {
      int64_t v = fallback;
      if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, name, &v)) {
        api->ReleaseStatus(st);
        if (required) attr_error_ += std::string("attribute '") + name + "' is required; ";
        v = fallback;
      }
      return v;
    };
    auto get_float = [&](const char* name, float fallback) {
      float v = fallback;
      if (OrtStatus* st = api->KernelInfoGetAttribute_float(info, name, &v)) {
        api->ReleaseStatus(st);
        v = fallback;
      }
      return v;
    };
    num_heads_ = get_int("num_heads", 0, true);
    num_kv_heads_ = get_int("num_kv_heads", 0, true);
    sliding_window_ = get_int("sliding_window", 0, false);
    scale_ = get_float("scale", 0.f);
    softcap_ = get_float("softcap", 0.f);
    if (attr_error_.empty() && (num_heads_ <= 0 || num_kv_heads_ <= 0 || num_heads_ % num_kv_heads_ != 0))
      attr_error_ = "num_heads (" + std::to_string(num_heads_) + ") must be a positive multiple of num_kv_heads (" +
                    std::to_string(num_kv_heads_) + "); ";
    if (sliding_window_ < 0) attr_error_ += "sliding_window must be >= 0 (0 = none); ";
    if (softcap_ < 0.f) attr_error_ += "softcap must be >= 0 (0 = none); ";
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& query, const Tensor<float>& key,
                      const Tensor<float>& value, const Tensor<float>& key_cache, const Tensor<float>& value_cache,
                      const Tensor<int64_t>& slot_mapping, const Tensor<int32_t>& block_tables,
                      const Tensor<int32_t>& context_lens, const Tensor<int32_t>& query_start_loc,
                      Tensor<float>& output, Tensor<float>& key_cache_out, Tensor<float>& value_cache_out) {
    try {
      std::string err;
      Problem P{};
      if (!attr_error_.empty()) return Error("PagedAttention: " + attr_error_);
      err = Validate(query, key, value, key_cache, value_cache, slot_mapping, block_tables, context_lens,
                     query_start_loc, P);
      if (!err.empty()) return Error("PagedAttention: " + err);

      // The caches are outputs aliased to the inputs: the caller binds one OrtValue to both.
      P.kc = key_cache_out.Allocate(key_cache.Shape());
      P.vc = value_cache_out.Allocate(value_cache.Shape());
      if (P.kc != key_cache.Data() || P.vc != value_cache.Data())
        return Error("PagedAttention: key_cache_out/value_cache_out must be the same OrtValue as key_cache/"
                     "value_cache (bind each cache as both input and output with IOBinding); got a separate "
                     "buffer, so the in-place cache update would be lost");
      P.out = output.Allocate({P.T, P.H * P.D});

      // 1. Write the new key/value rows at their slots (in token order; -1 = skip).
      const int64_t* slots = slot_mapping.Data();
      for (int64_t t = 0; t < P.T; ++t) {
        if (slots[t] < 0) continue;
        const int64_t blk = slots[t] / P.block_size, off = slots[t] % P.block_size;
        for (int64_t g = 0; g < P.KVH; ++g) {
          const int64_t row = ((blk * P.KVH + g) * P.block_size + off) * P.D;
          std::memcpy(P.kc + row, key.Data() + (t * P.KVH + g) * P.D, P.D * sizeof(float));
          std::memcpy(P.vc + row, value.Data() + (t * P.KVH + g) * P.D, P.D * sizeof(float));
        }
      }

      // 2. Attention, parallel over (sequence, kv head, query tile).
      std::vector<WorkItem> items;
      constexpr int32_t kTile = 16;
      for (int32_t b = 0; b < P.B; ++b)
        for (int32_t g = 0; g < P.KVH; ++g)
          for (int32_t r = P.qsl[b]; r < P.qsl[b + 1]; r += kTile)
            items.push_back({b, g, r, std::min(r + kTile, P.qsl[b + 1])});
      ParallelData data{&P, &items};
      if (!items.empty()) Ort::KernelContext(context).ParallelFor(RunWorkItemTask, items.size(), 0, &data);
      return Ort::Status{nullptr};
    } catch (const std::exception& e) {
      return Error(std::string("PagedAttention: ") + e.what());
    }
  }

 private:
  static Ort::Status Error(const std::string& msg) { return Ort::Status(msg.c_str(), ORT_INVALID_ARGUMENT); }

  std::string Validate(const Tensor<float>& query, const Tensor<float>& key, const Tensor<float>& value,
                       const Tensor<float>& key_cache, const Tensor<float>& value_cache,
                       const Tensor<int64_t>& slot_mapping, const Tensor<int32_t>& block_tables,
                       const Tensor<int32_t>& context_lens, const Tensor<int32_t>& query_start_loc, Problem& P) {
    const auto &qs = query.Shape(), &ks = key.Shape(), &vs = value.Shape();
    const auto &kcs = key_cache.Shape(), &vcs = value_cache.Shape();
    const auto &sms = slot_mapping.Shape(), &bts = block_tables.Shape();
    const auto &cls = context_lens.Shape(), &qls = query_start_loc.Shape();
    if (qs.size() != 2 || qs[1] % num_heads_ != 0)
      return "query must be [T, num_heads*head_size] with num_heads=" + std::to_string(num_heads_) + ", got " +
             ShapeStr(qs);
    P.T = qs[0], P.H = num_heads_, P.KVH = num_kv_heads_, P.D = qs[1] / num_heads_, P.group = P.H / P.KVH;
    if (P.D < 32 || P.D > 256)
      return "head_size (query width " + std::to_string(qs[1]) + " / num_heads " + std::to_string(P.H) +
             ") = " + std::to_string(P.D) + " is outside the supported range [32, 256]";
    const std::vector<int64_t> kv_shape{P.T, P.KVH * P.D};
    if (ks != kv_shape) return "key must be [T, num_kv_heads*head_size] = " + ShapeStr(kv_shape) + ", got " + ShapeStr(ks);
    if (vs != kv_shape) return "value must be [T, num_kv_heads*head_size] = " + ShapeStr(kv_shape) + ", got " + ShapeStr(vs);
    if (kcs.size() != 4 || kcs[1] != P.KVH || kcs[3] != P.D || kcs[2] <= 0)
      return "key_cache must be [num_blocks, num_kv_heads=" + std::to_string(P.KVH) + ", block_size, head_size=" +
             std::to_string(P.D) + "], got " + ShapeStr(kcs);
    if (vcs != kcs) return "value_cache shape " + ShapeStr(vcs) + " differs from key_cache shape " + ShapeStr(kcs);
    P.num_blocks = kcs[0], P.block_size = kcs[2];
    if (sms != std::vector<int64_t>{P.T}) return "slot_mapping must be [T] = [" + std::to_string(P.T) + "], got " + ShapeStr(sms);
    if (bts.size() != 2) return "block_tables must be [B, max_blocks], got " + ShapeStr(bts);
    P.B = bts[0], P.max_blocks = bts[1];
    if (cls != std::vector<int64_t>{P.B})
      return "context_lens must be [B] = [" + std::to_string(P.B) + "] (rows of block_tables), got " + ShapeStr(cls);
    if (qls != std::vector<int64_t>{P.B + 1})
      return "query_start_loc must be [B+1] = [" + std::to_string(P.B + 1) + "], got " + ShapeStr(qls);

    P.scale = scale_ != 0.f ? scale_ : 1.f / std::sqrt(static_cast<float>(P.D));
    P.softcap = softcap_, P.window = sliding_window_;
    P.q = query.Data(), P.block_tables = block_tables.Data(), P.context_lens = context_lens.Data();
    P.qsl = query_start_loc.Data();

    // Slots: -1 or inside the cache.
    const int64_t* slots = slot_mapping.Data();
    const int64_t num_slots = P.num_blocks * P.block_size;
    for (int64_t t = 0; t < P.T; ++t)
      if (slots[t] < -1 || slots[t] >= num_slots)
        return "slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slots[t]) +
               " is outside the cache (valid: -1 or 0.." + std::to_string(num_slots - 1) + " = num_blocks*block_size-1)";
    // query_start_loc: starts at 0, non-decreasing, ends at T; each q_len <= context_len.
    if (P.qsl[0] != 0) return "query_start_loc[0] = " + std::to_string(P.qsl[0]) + ", must be 0";
    if (P.qsl[P.B] != P.T)
      return "query_start_loc[B=" + std::to_string(P.B) + "] = " + std::to_string(P.qsl[P.B]) +
             " must equal the number of query rows T = " + std::to_string(P.T);
    for (int64_t b = 0; b < P.B; ++b) {
      const int64_t q_len = int64_t{P.qsl[b + 1]} - P.qsl[b], ctx = P.context_lens[b];
      if (q_len < 0)
        return "query_start_loc must be non-decreasing, but query_start_loc[" + std::to_string(b) + "] = " +
               std::to_string(P.qsl[b]) + " > query_start_loc[" + std::to_string(b + 1) + "] = " + std::to_string(P.qsl[b + 1]);
      if (ctx < q_len)
        return "context_lens[" + std::to_string(b) + "] = " + std::to_string(ctx) + " is less than the sequence's " +
               "query length " + std::to_string(q_len) + " (from query_start_loc); context_lens counts the cached tokens "
               "including this step's";
      if (ctx > P.max_blocks * P.block_size)
        return "context_lens[" + std::to_string(b) + "] = " + std::to_string(ctx) + " exceeds block_tables capacity " +
               std::to_string(P.max_blocks) + " blocks * block_size " + std::to_string(P.block_size);
      if (q_len == 0) continue;
      // Every block this sequence reads must be a real block.
      const int64_t first = P.window > 0 ? std::max<int64_t>(0, ctx - q_len - P.window + 1) : 0;
      for (int64_t j = first / P.block_size; j * P.block_size < ctx; ++j) {
        const int32_t blk = P.block_tables[b * P.max_blocks + j];
        if (blk < 0 || blk >= P.num_blocks)
          return "block_tables[" + std::to_string(b) + "][" + std::to_string(j) + "] = " + std::to_string(blk) +
                 " is out of range: the cache has num_blocks = " + std::to_string(P.num_blocks);
      }
    }
    return {};
  }

  int64_t num_heads_ = 0, num_kv_heads_ = 0, sliding_window_ = 0;
  float scale_ = 0.f, softcap_ = 0.f;
  std::string attr_error_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  // The op and its domains must outlive every session that uses them.
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op{
      Ort::Custom::CreateLiteCustomOp<PagedAttention>("PagedAttention", "CPUExecutionProvider", 1)};
  static std::vector<Ort::CustomOpDomain> domains;
  static std::mutex mutex;
  try {
    std::lock_guard<std::mutex> lock(mutex);
    Ort::CustomOpDomain domain{"ortserve"};
    domain.Add(op.get());
    Ort::UnownedSessionOptions(options).Add(domain);
    domains.push_back(std::move(domain));
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
  return nullptr;
}
