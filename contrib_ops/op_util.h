// Small helpers the ops' front ends share (compiled without ISA flags, so inline is safe here).
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "matmul_q_kernel.h"

namespace ortserve {

// Online CPUs: an upper bound on the session's intra-op threads (which a kernel cannot query); the
// ops split their work into about 4 tasks for each.
inline int64_t CpuCount() {
  static const int64_t count = std::max(1u, std::thread::hardware_concurrency());
  return count;
}

// [0, units) cut into `count` ranges whose sizes differ by one at most. A linear's decode call is a few
// such tiles a thread, which the pool hands out as they finish: with tiles of a fixed size and a
// smaller last one (9 of 2 panels and 1 for 18 panels), one thread ran alone at the end of each call
// (SmolLM2-135M and Qwen2.5-0.5B fp32 decode 1.02x faster split evenly: benchmarks/tables/matmul_f.md).
struct EvenTiles {
  int64_t units, count;
  int64_t Begin(int64_t tile) const { return units * tile / count; }
  int64_t End(int64_t tile) const { return units * (tile + 1) / count; }
};

// A decode call's tiles of `units`: about 4 a CPU.
inline EvenTiles DecodeTiles(int64_t units) { return {units, std::max<int64_t>(1, std::min(units, 4 * CpuCount()))}; }

// Tiles of about `per_tile` units each (prefill chunks).
inline EvenTiles TilesOf(int64_t units, int64_t per_tile) {
  return {units, std::max<int64_t>(1, (units + per_tile - 1) / per_tile)};
}

// The op name's suffix of a quantised op's Bits: "4", "5", "8", "4NL" (centred: "4S" ... "4NLS"), "4K", "5K", "3K" or
// "6K".
inline std::string QSuffix(int bits) {
  if (bits == kQ4XS) return "4XS";
  if (bits & kQCentred) return QSuffix(bits & ~kQCentred) + "S";
  if (bits == kQ4NL) return "4NL";
  if (bits == kQ4K || bits == kQ5K || bits == kQ2K || bits == kQ3K || bits == kQ6K) return std::to_string(bits & 0xF) + "K";
  return std::to_string(bits);
}

// The scales a quantised op's weight [N, K] has: a (d, m) pair per row and block of 32 columns, [G, KB, 2, 16],
// MatMulQ3K's, Q6K's and Q4XS's d per row and 8 blocks, [G, ceil(KB / 8), 16], or MatMulQ4K's, Q5K's and Q2K's (d, -dmin),
// [G, ceil(KB / 8), 2, 16]; the centred layouts' d per row and block, [G, KB, 16].
inline std::vector<int64_t> QScalesShape(int bits, int64_t G, int64_t KB) {
  const int64_t super_blocks = (KB + kQSuperBlocks - 1) / kQSuperBlocks;
  if (bits == kQ3K || bits == kQ6K || bits == kQ4XS) return {G, super_blocks, kQGroup};
  if (bits == kQ4K || bits == kQ5K || bits == kQ2K) return {G, super_blocks, 2, kQGroup};
  if (bits & kQCentred) return {G, KB, kQGroup};
  return {G, KB, 2, kQGroup};
}

// The 28 kernels of a quantised op, Op<bits, scale type>: 4, 5 and 8 bits and Q4NL (each centred too: "S"), Q4K, Q5K,
// Q2K, Q3K, Q6K and Q4XS, each with fp16
// or fp32 scales, named base + QSuffix ("MatMulQ4", "MatMulQ4NL"); onnxruntime picks by the scales' type.
// Made once.
template <template <int, typename> class Op>
std::vector<Ort::Custom::OrtLiteCustomOp*> QuantizedKernels(const std::string& base) {
  using Ort::Custom::CreateLiteCustomOp;
  using Kernel = std::unique_ptr<Ort::Custom::OrtLiteCustomOp>;
  static const std::vector<Kernel> kernels = [&] {
    std::vector<Kernel> all;
    const auto add = [&](auto bits) {
      constexpr int kBits = decltype(bits)::value;
      const std::string name = base + QSuffix(kBits);
      all.emplace_back(CreateLiteCustomOp<Op<kBits, Ort::Float16_t>>(name.c_str(), "CPUExecutionProvider", 1));
      all.emplace_back(CreateLiteCustomOp<Op<kBits, float>>(name.c_str(), "CPUExecutionProvider", 1));
    };
    add(std::integral_constant<int, 4>{});
    add(std::integral_constant<int, 5>{});
    add(std::integral_constant<int, 8>{});
    add(std::integral_constant<int, kQ4NL>{});
    add(std::integral_constant<int, 4 | kQCentred>{});
    add(std::integral_constant<int, 5 | kQCentred>{});
    add(std::integral_constant<int, 8 | kQCentred>{});
    add(std::integral_constant<int, kQ4NL | kQCentred>{});
    add(std::integral_constant<int, kQ4K>{});
    add(std::integral_constant<int, kQ5K>{});
    add(std::integral_constant<int, kQ6K>{});
    add(std::integral_constant<int, kQ3K>{});
    add(std::integral_constant<int, kQ4XS>{});
    add(std::integral_constant<int, kQ2K>{});
    return all;
  }();
  std::vector<Ort::Custom::OrtLiteCustomOp*> out;
  for (const Kernel& k : kernels) out.push_back(k.get());
  return out;
}

// "[2, 3, 256]", for error messages.
inline std::string ShapeText(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// An optional input, null when absent or of shape [0] (the stand-in that keeps later inputs in place).
inline const Ort::Custom::Tensor<float>* Present(std::optional<const Ort::Custom::Tensor<float>*> input) {
  if (!input.has_value() || *input == nullptr) return nullptr;
  const std::vector<int64_t>& shape = (*input)->Shape();
  return shape.size() == 1 && shape[0] == 0 ? nullptr : *input;
}

// An int attribute, or fallback when the node does not set it.
inline int64_t IntAttribute(const OrtApi* api, const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t value = fallback;
  if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, name, &value)) {
    api->ReleaseStatus(st);
    value = fallback;
  }
  return value;
}

// Once a kernel holds its own copy of a constant, onnxruntime's (a private mapping of the data file,
// one per initializer) is never read again by it; its pages stay resident, though, and double the
// process's RSS for the weights. MADV_PAGEOUT asks the kernel to reclaim them now: file pages are
// dropped and read back from the file if anything touches them again (a tied embedding's Gather
// reads its rows), anonymous ones are only swapped out where there is swap, so the data is safe
// whatever memory onnxruntime used. Only whole pages inside [data, data + bytes) are advised.
inline void ReleaseSourcePages(const void* data, size_t bytes) {
#ifdef MADV_PAGEOUT
  const uintptr_t page = 4096, begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page,
                  end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
  (void)data, (void)bytes;
#endif
}

// A copy of the node's input `index` when it is a constant initializer (else null), in anonymous
// memory of the op's own. onnxruntime hands a constant over as a view of the data file's mapping,
// which stays on 4 KiB pages, and decode reads every weight once per token in one stream: with 4 KiB
// pages the hardware prefetchers stop at each page (22-23 GB/s against 30 GB/s on 2 MiB pages,
// Sapphire Rapids, benchmarks/membw.py). The engine collapses the anonymous memory a session
// allocated into huge pages (ortserve/engine/huge_pages.py), this copy included.
inline std::shared_ptr<const uint8_t> CopyOfConstantInput(const OrtKernelInfo* info, size_t index) {
  try {
    int is_constant = 0;
    Ort::ConstValue value = Ort::ConstKernelInfo(info).GetTensorConstantInput(index, &is_constant);
    if (!is_constant || value == nullptr) return nullptr;
    const auto shape = value.GetTensorTypeAndShapeInfo();
    const ONNXTensorElementDataType type = shape.GetElementType();
    const size_t element = type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8     ? 1
                           : type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? 2
                           : type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT   ? 4
                                                                           : 0;
    if (element == 0) return nullptr;  // only the types the ops' weights come in
    const size_t bytes = shape.GetElementCount() * element;
    void* copy = bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
    if (copy == nullptr) return nullptr;
    std::memcpy(copy, value.GetTensorRawData(), bytes);
    ReleaseSourcePages(value.GetTensorRawData(), bytes);
    return {static_cast<const uint8_t*>(copy), [](const uint8_t* p) { std::free(const_cast<uint8_t*>(p)); }};
  } catch (const Ort::Exception&) {
    return nullptr;  // not available: read the input per call, as before
  }
}

}  // namespace ortserve
