// What both attention ops (PagedAttention, PackedPagedAttention) share (docs/design.md §1): the attributes, the
// checks of the cache and batch-index inputs, and the attention itself (work plan, thread pool,
// split-K merge) over caches that already hold this step's keys and values.
// PagedAttention (paged_attention.cc) takes query, key and value; PackedPagedAttention
// (paged_attention_packed.cc) takes the packed qkv projection and applies q/k norm and rotary.
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "paged_attention_kernel.h"

namespace ortserve {

using Ort::Custom::Tensor;

std::string ShapeStr(const std::vector<int64_t>& shape);

// An ORT_INVALID_ARGUMENT status whose message starts with the op's name.
Ort::Status OpError(const std::string& message);

// num_heads, num_kv_heads (required), scale, sliding_window, softcap; `error` lists what is wrong.
struct AttentionAttrs {
  int64_t num_heads = 0, num_kv_heads = 0, sliding_window = 0;
  float scale = 0.f, softcap = 0.f;
  std::string error;
  AttentionAttrs(const OrtApi* api, const OrtKernelInfo* info);
};

// Sets P.H, P.KVH, P.group, P.D and the attributes' fields of P; an error names the limit and
// `derivation`, how the caller found head_size (e.g. "query width 256 / num_heads 4").
std::string SetHeads(const AttentionAttrs& a, int64_t head_size, const std::string& derivation, Problem& P);

// The caches and the batch-index inputs against P.T, P.KVH, P.D and P.cache (set by the caller);
// fills the cache and batch fields of P. Nothing is written before every check has passed.
std::string ValidateBatch(const std::vector<int64_t>& key_cache_shape, const std::vector<int64_t>& value_cache_shape,
                          const Tensor<int64_t>& slot_mapping, const Tensor<int32_t>& block_tables,
                          const Tensor<int32_t>& context_lens, const Tensor<int32_t>& query_start_loc, Problem& P);

// The caches are outputs aliased to the inputs: the caller binds one OrtValue to both. Sets P.kc
// and P.vc, or returns the error that says how to bind them.
template <typename T>
std::string AliasCaches(const Tensor<T>& key_cache, const Tensor<T>& value_cache, Tensor<T>& key_cache_out,
                        Tensor<T>& value_cache_out, Problem& P) {
  T* k = key_cache_out.Allocate(key_cache.Shape());
  T* v = value_cache_out.Allocate(value_cache.Shape());
  if (k != key_cache.Data() || v != value_cache.Data())
    return "key_cache_out/value_cache_out must be the same OrtValue as key_cache/value_cache (bind each cache as "
           "both input and output with IOBinding); got a separate buffer, so the in-place cache update would be lost";
  P.kc = reinterpret_cast<unsigned char*>(k), P.vc = reinterpret_cast<unsigned char*>(v);
  return {};
}

// The cache type that holds elements of T (float, Ort::Float16_t, int8_t).
template <typename T>
constexpr CacheType CacheTypeOf() {
  if constexpr (std::is_same_v<T, Ort::Float16_t>) return CacheType::kF16;
  else if constexpr (std::is_same_v<T, int8_t>) return CacheType::kI8;
  else return CacheType::kF32;
}

// Writes D floats as one cache row of P.cache at dst: copied, rounded to half (to nearest even),
// or int8 codes x / scale rounded to nearest even with scale = max |x| / 127 after them.
void WriteRow(const Problem& P, unsigned char* dst, const float* src);

// The byte offset of the cache row of kv head g at slot (block * block_size + offset).
inline int64_t CacheRowOffset(const Problem& P, int64_t slot, int64_t g) {
  return ((slot / P.block_size * P.KVH + g) * P.block_size + slot % P.block_size) * P.row_bytes;
}

// Attention of P.q against the caches into P.out, parallel over (sequence, kv head, query tile
// [, split-K piece]) on the session's intra-op pool.
void Attend(OrtKernelContext* context, const Problem& P);

}  // namespace ortserve
