// See paged_attention_core.h.
#include "paged_attention_core.h"

#include "isa.h"
#include "op_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>

namespace ortserve {

namespace {

using RunFn = void (*)(const Problem&, const WorkItem&);
using LanesFn = int (*)();

// The kernel build for this CPU: its work-item function and the most lanes a tile should have.
struct KernelBuild {
  RunFn run;
  int64_t tile_lanes;
};

KernelBuild PickKernel() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return {generic::RunWorkItem, generic::TileLanes()};
#else
  return {PickBuild<RunFn>(avx512::RunWorkItem, avx2::RunWorkItem, generic::RunWorkItem),
          PickBuild<LanesFn>(avx512::TileLanes, avx2::TileLanes, generic::TileLanes)()};
#endif
}

constexpr int64_t kMinSplitKeys = 256;  // a split-K piece covers at least this many positions

// The parallel work of one call. items[order[i]] is the i-th task handed to the thread pool
// (largest first, for balance); split[g] = (first item, piece count) of each split-K tile.
struct Plan {
  std::vector<WorkItem> items;
  std::vector<size_t> order;
  std::vector<std::pair<size_t, size_t>> split;
  std::vector<float> partials;
  const Problem* problem;
  RunFn run;
};

// Work items over (sequence, kv head, query tile): a tile packs whole query rows times the
// kv head's query heads into <= `lanes` lanes (the kernel build's TileLanes()), so each cached K/V
// row is read once per tile.
// With fewer tiles than 4x the CPUs, long key ranges are split into >= 256-position pieces.
void PlanWork(const Problem& P, int64_t lanes, Plan& plan) {
  const int64_t heads = std::min<int64_t>(P.group, lanes);
  const int64_t rows_per_tile = std::max<int64_t>(1, lanes / heads);
  std::vector<WorkItem> tiles;
  for (int32_t b = 0; b < P.B; ++b) {
    const int64_t q_begin = P.qsl[b], q_end = P.qsl[b + 1], ctx = P.context_lens[b];
    for (int64_t r = q_begin; r < q_end; r += rows_per_tile) {
      const int64_t r_end = std::min(r + rows_per_tile, q_end);
      const int64_t first_pos = ctx - (q_end - q_begin) + (r - q_begin);  // position of row r
      const int64_t key_begin = P.window > 0 ? std::max<int64_t>(0, first_pos - P.window + 1) : 0;
      const int64_t key_end = ctx - (q_end - r_end);  // last row's position + 1
      for (int64_t g = 0; g < P.KVH; ++g)
        for (int64_t h = g * P.group; h < (g + 1) * P.group; h += heads)
          tiles.push_back(WorkItem{b, int32_t(g), int32_t(h), int32_t(std::min(h + heads, (g + 1) * P.group)),
                                   int32_t(r), int32_t(r_end), int32_t(key_begin), int32_t(key_end), nullptr});
    }
  }
  const int64_t target = 4 * CpuCount();  // more pieces than threads cost little: each is >= 256 positions
  const int64_t want = tiles.empty() ? 1 : (target + tiles.size() - 1) / tiles.size();
  for (const WorkItem& t : tiles) {
    const int64_t keys = t.key_end - t.key_begin;
    const int64_t pieces = std::max<int64_t>(1, std::min(want, keys / kMinSplitKeys));
    if (pieces == 1) {
      plan.items.push_back(t);
      continue;
    }
    const int64_t step = ((keys + pieces - 1) / pieces + 15) / 16 * 16;
    const size_t first = plan.items.size();
    for (int64_t k = t.key_begin; k < t.key_end; k += step) {
      WorkItem piece = t;
      piece.key_begin = int32_t(k), piece.key_end = int32_t(std::min<int64_t>(k + step, t.key_end));
      plan.items.push_back(piece);
    }
    plan.split.emplace_back(first, plan.items.size() - first);
  }
  plan.partials.assign(plan.split.empty() ? 0 : plan.items.size() * PartialFloats(P.D), 0.f);
  for (const auto& [first, count] : plan.split)
    for (size_t i = first; i < first + count; ++i) plan.items[i].partial = plan.partials.data() + i * PartialFloats(P.D);
  std::vector<int64_t> cost(plan.items.size());  // ~ lanes x positions
  for (size_t i = 0; i < cost.size(); ++i) {
    const WorkItem& w = plan.items[i];
    cost[i] = int64_t{w.row_end - w.row_begin} * (w.head_end - w.head_begin) * (w.key_end - w.key_begin);
  }
  plan.order.resize(plan.items.size());
  std::iota(plan.order.begin(), plan.order.end(), 0);
  std::stable_sort(plan.order.begin(), plan.order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
}

void RunTask(void* data, size_t index) {
  auto* plan = static_cast<const Plan*>(data);
  plan->run(*plan->problem, plan->items[plan->order[index]]);
}

// Merge split-K pieces s of one tile: m = max_s m_s, out = sum_s e^{m_s - m} acc_s / sum_s e^{m_s - m} l_s.
void MergeSplits(const Problem& P, const Plan& plan) {
  std::vector<float> acc(P.D);
  for (const auto& [first, count] : plan.split) {
    const WorkItem& w = plan.items[first];
    const int64_t heads = w.head_end - w.head_begin;
    for (int64_t r = w.row_begin; r < w.row_end; ++r) {
      for (int64_t h = w.head_begin; h < w.head_end; ++h) {
        const int64_t m = (r - w.row_begin) * heads + (h - w.head_begin);
        float max = -std::numeric_limits<float>::infinity(), sum = 0.f;
        for (size_t i = first; i < first + count; ++i) max = std::max(max, plan.items[i].partial[m]);
        std::fill(acc.begin(), acc.end(), 0.f);
        for (size_t i = first; i < first + count; ++i) {
          const float* part = plan.items[i].partial;
          const float weight = std::exp(part[m] - max);
          sum += weight * part[kMaxLanes + m];
          for (int64_t d = 0; d < P.D; ++d) acc[d] += weight * part[2 * kMaxLanes + d * kMaxLanes + m];
        }
        float* out = P.out + (r * P.H + h) * P.D;
        for (int64_t d = 0; d < P.D; ++d) out[d] = acc[d] / sum;
      }
    }
  }
}

}  // namespace

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Ort::Status OpError(const std::string& message) {
  return Ort::Status(("PagedAttention: " + message).c_str(), ORT_INVALID_ARGUMENT);
}

AttentionAttrs::AttentionAttrs(const OrtApi* api, const OrtKernelInfo* info) {
  auto get_int = [&](const char* name, int64_t fallback, bool required) {
    int64_t v = fallback;
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, name, &v)) {
      api->ReleaseStatus(st);
      if (required) error += std::string("attribute '") + name + "' is required; ";
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
  num_heads = get_int("num_heads", 0, true);
  num_kv_heads = get_int("num_kv_heads", 0, true);
  sliding_window = get_int("sliding_window", 0, false);
  scale = get_float("scale", 0.f);
  softcap = get_float("softcap", 0.f);
  if (error.empty() && (num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0))
    error = "num_heads (" + std::to_string(num_heads) + ") must be a positive multiple of num_kv_heads (" +
            std::to_string(num_kv_heads) + "); ";
  if (sliding_window < 0) error += "sliding_window must be >= 0 (0 = none); ";
  if (softcap < 0.f) error += "softcap must be >= 0 (0 = none); ";
}

std::string SetHeads(const AttentionAttrs& a, int64_t head_size, const std::string& derivation, Problem& P) {
  P.H = a.num_heads, P.KVH = a.num_kv_heads, P.group = P.H / P.KVH, P.D = head_size;
  if (P.D < kMinHeadSize || P.D > kMaxHeadSize)
    return "head_size (" + derivation + ") = " + std::to_string(P.D) + " is outside the supported range [" + std::to_string(kMinHeadSize) +
           ", " + std::to_string(kMaxHeadSize) + "]";
  P.scale = a.scale != 0.f ? a.scale : 1.f / std::sqrt(static_cast<float>(P.D));
  P.softcap = a.softcap, P.window = a.sliding_window;
  return {};
}

std::string ValidateBatch(const std::vector<int64_t>& kcs, const std::vector<int64_t>& vcs,
                          const Tensor<int64_t>& slot_mapping, const Tensor<int32_t>& block_tables,
                          const Tensor<int32_t>& context_lens, const Tensor<int32_t>& query_start_loc, Problem& P) {
  const auto &sms = slot_mapping.Shape(), &bts = block_tables.Shape();
  const auto &cls = context_lens.Shape(), &qls = query_start_loc.Shape();
  const int64_t width = CacheRowWidth(P.cache, P.D);
  P.row_bytes = CacheRowBytes(P.cache, P.D);
  if (kcs.size() != 4 || kcs[1] != P.KVH || kcs[3] != width || kcs[2] <= 0)
    return "key_cache must be [num_blocks, num_kv_heads=" + std::to_string(P.KVH) + ", block_size, " +
           (P.cache == CacheType::kI8 ? "head_size+4=" : "head_size=") + std::to_string(width) + "], got " +
           ShapeStr(kcs);
  if (vcs != kcs) return "value_cache shape " + ShapeStr(vcs) + " differs from key_cache shape " + ShapeStr(kcs);
  P.num_blocks = kcs[0], P.block_size = kcs[2];
  if (sms != std::vector<int64_t>{P.T}) return "slot_mapping must be [T] = [" + std::to_string(P.T) + "], got " + ShapeStr(sms);
  if (bts.size() != 2) return "block_tables must be [B, max_blocks], got " + ShapeStr(bts);
  P.B = bts[0], P.max_blocks = bts[1];
  if (cls != std::vector<int64_t>{P.B})
    return "context_lens must be [B] = [" + std::to_string(P.B) + "] (rows of block_tables), got " + ShapeStr(cls);
  if (qls != std::vector<int64_t>{P.B + 1})
    return "query_start_loc must be [B+1] = [" + std::to_string(P.B + 1) + "], got " + ShapeStr(qls);
  P.block_tables = block_tables.Data(), P.context_lens = context_lens.Data(), P.qsl = query_start_loc.Data();
  P.slots = slot_mapping.Data();

  // Slots: -1 or inside the cache.
  const int64_t num_slots = P.num_blocks * P.block_size;
  for (int64_t t = 0; t < P.T; ++t)
    if (P.slots[t] < -1 || P.slots[t] >= num_slots)
      return "slot_mapping[" + std::to_string(t) + "] = " + std::to_string(P.slots[t]) +
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

namespace {

// float -> half bits, rounded to nearest even (as numpy's astype(float16) and F16C's vcvtps2ph):
// overflow -> inf, nan stays nan, subnormal halves through one float addition.
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x47800000u) return sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00);  // >= 65536, inf, nan
  if (x < 0x38800000u) {  // below 2^-14: the sum's low mantissa bits are the rounded subnormal
    float magic, g;
    const uint32_t magic_bits = 126u << 23;  // 0.5: aligns 2^-24 with the float's last mantissa bit
    std::memcpy(&magic, &magic_bits, 4);
    std::memcpy(&g, &x, 4);
    g += magic;
    uint32_t r;
    std::memcpy(&r, &g, 4);
    return sign | static_cast<uint16_t>(r - magic_bits);
  }
  const uint32_t odd = (x >> 13) & 1u;  // ties go to the even mantissa
  x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
  return sign | static_cast<uint16_t>(x >> 13);
}

}  // namespace

void WriteRow(const Problem& P, unsigned char* dst, const float* src) {
  const int64_t D = P.D;
  if (P.cache == CacheType::kF32) {
    std::memcpy(dst, src, D * sizeof(float));
  } else if (P.cache == CacheType::kF16) {
    for (int64_t d = 0; d < D; ++d) {
      const uint16_t h = FloatToHalf(src[d]);
      std::memcpy(dst + 2 * d, &h, 2);
    }
  } else {
    float amax = 0.f;
    for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(src[d]));
    const float scale = amax / 127.f;
    for (int64_t d = 0; d < D; ++d) {
      const float code = scale > 0.f ? std::nearbyint(src[d] / scale) : 0.f;
      dst[d] = static_cast<unsigned char>(static_cast<int8_t>(std::min(127.f, std::max(-127.f, code))));
    }
    std::memcpy(dst + D, &scale, 4);
  }
}

void Attend(OrtKernelContext* context, const Problem& P) {
  Plan plan;
  const KernelBuild build = PickKernel();
  plan.problem = &P, plan.run = build.run;
  PlanWork(P, build.tile_lanes, plan);
  if (!plan.items.empty()) Ort::KernelContext(context).ParallelFor(RunTask, plan.items.size(), 0, &plan);
  MergeSplits(P, plan);
}

}  // namespace ortserve
