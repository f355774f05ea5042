// Interface between the PagedAttention op (paged_attention.cc: validation, cache write, work
// partition, threads) and its attention kernel (paged_attention_kernel.cc, compiled once per ISA).
#pragma once

#include <cstdint>

namespace ortserve {

// How the caches hold one row (one position of one kv head): D floats, D halves, or D int8 codes
// followed by their float32 scale (x = code * scale, scale = max |x| / 127, codes rounded to even).
enum class CacheType : int32_t { kF32 = 0, kF16 = 1, kI8 = 2 };

// The cache's last dimension, in elements of its type, for a head of D values.
inline int64_t CacheRowWidth(CacheType t, int64_t D) { return t == CacheType::kI8 ? D + 4 : D; }
inline int64_t CacheRowBytes(CacheType t, int64_t D) {
  return t == CacheType::kF32 ? 4 * D : t == CacheType::kF16 ? 2 * D : D + 4;
}

// One validated call of the op. Shapes as in docs/design.md §1; D = head_size.
struct Problem {
  int64_t T, H, KVH, D, group, num_blocks, block_size, B, max_blocks;
  float scale, softcap;
  int64_t window;  // sliding window, 0 = none
  const float* q;  // [T, H, D]
  float* out;      // [T, H, D]
  CacheType cache;
  int64_t row_bytes;  // CacheRowBytes(cache, D)
  unsigned char* kc;  // [num_blocks, KVH, block_size, row]
  unsigned char* vc;  // same
  const int32_t* block_tables;
  const int32_t* context_lens;
  const int32_t* qsl;  // query_start_loc
  const int64_t* slots;  // slot_mapping [T]: block*block_size + offset of each new token, -1 = none
};

constexpr int kMinHeadSize = 32, kMaxHeadSize = 256;  // validated by the op
constexpr int kMaxLanes = 16;  // query vectors per work item at most = SIMD lanes of the kernel

// Query heads [head_begin, head_end) of one kv head, for query rows [row_begin, row_end) of one
// sequence, over cached positions [key_begin, key_end). Lanes are (row, head) pairs, row-major.
// partial == nullptr: the item covers every visible position and writes the output rows.
// Otherwise it is one split-K piece: it writes its running max, sum and unnormalised accumulator.
struct WorkItem {
  int32_t seq, kv_head, head_begin, head_end, row_begin, row_end, key_begin, key_end;
  float* partial;  // [kMaxLanes max | kMaxLanes sum | D x kMaxLanes acc] or nullptr
};

inline int64_t PartialFloats(int64_t head_size) { return 2 * kMaxLanes + head_size * kMaxLanes; }

// The kernel, one build per instruction set; paged_attention.cc picks one at run time.
// TileLanes(): the most lanes a work item should have for that build (16 with AVX-512 and AVX2, in
// one or two registers; 8 in the generic build's 128-bit registers).
#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
namespace avx512 { void RunWorkItem(const Problem& p, const WorkItem& w); int TileLanes(); }
namespace avx2 { void RunWorkItem(const Problem& p, const WorkItem& w); int TileLanes(); }
#endif
namespace generic { void RunWorkItem(const Problem& p, const WorkItem& w); int TileLanes(); }

}  // namespace ortserve
