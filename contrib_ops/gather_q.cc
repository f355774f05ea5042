// See gather_q.h. A lookup reads one row's bytes (4 of every 64), a few rows a step: no SIMD needed.
#include "gather_q.h"

#include "matmul_q_kernel.h"
#include "op_util.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace ortserve;
using Ort::Custom::Tensor;

#define ALWAYS_INLINE inline __attribute__((always_inline))
#include "simd_math.h"  // HalfToFloat

template <typename S>
float ScaleValue(const S& s) {
  if constexpr (std::is_same_v<S, float>) {
    return s;
  } else {
    uint16_t bits;
    std::memcpy(&bits, &s, 2);
    return HalfToFloat(bits);
  }
}

template <int Bits, typename ScaleT>
struct GatherQ {
  static constexpr int64_t kBlockBytes = kQBlockBytesOf<Bits>;

  GatherQ(const OrtApi* api, const OrtKernelInfo* info)
      : N_(IntAttribute(api, info, "N", 0)), K_(IntAttribute(api, info, "K", 0)) {}

  Ort::Status Compute(const Tensor<uint8_t>& codes, const Tensor<ScaleT>& scales, const Tensor<int64_t>& indices,
                      Tensor<float>& y) {
    if (N_ <= 0 || K_ <= 0) return Error("attributes 'N' and 'K' (the weight's shape) are required and must be > 0");
    const int64_t G = (N_ + kQGroup - 1) / kQGroup, KB = (K_ + kQBlock - 1) / kQBlock;
    if (codes.Shape() != std::vector<int64_t>{G, KB, kBlockBytes})
      return Error("codes must be " + ShapeText({G, KB, kBlockBytes}) + ", got " + ShapeText(codes.Shape()));
    if (scales.Shape() != QScalesShape(Bits, G, KB))
      return Error("scales must be " + ShapeText(QScalesShape(Bits, G, KB)) + ", got " + ShapeText(scales.Shape()));
    if (indices.Shape().size() != 1) return Error("indices must be [T], got " + ShapeText(indices.Shape()));
    const int64_t T = indices.Shape()[0];
    const int64_t* ids = indices.Data();
    for (int64_t t = 0; t < T; ++t)
      if (ids[t] < 0 || ids[t] >= N_)
        return Error("index " + std::to_string(ids[t]) + " at " + std::to_string(t) + " is outside [0, " +
                     std::to_string(N_) + ")");
    float* out = y.Allocate({T, K_});
    const uint8_t* c = codes.Data();
    const ScaleT* s = scales.Data();
    const int64_t super_blocks = (KB + kQSuperBlocks - 1) / kQSuperBlocks;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t g = ids[t] / kQGroup, r = ids[t] % kQGroup;
      for (int64_t b = 0; b < KB; ++b) {
        const uint8_t* block = c + (g * KB + b) * kBlockBytes;
        float* row = out + t * K_ + b * kQBlock;
        const int64_t columns = std::min(kQBlock, K_ - b * kQBlock);
        if constexpr (kQSub16Of<Bits>) {
          const ScaleT* sd = s + (g * super_blocks + b / kQSuperBlocks) * (kQSub16MinsOf<Bits> ? 2 : 1) * kQGroup + r;
          Sub16Row(block, ScaleValue(sd[0]), kQSub16MinsOf<Bits> ? ScaleValue(sd[kQGroup]) : 0.f, r, columns, row);
        } else if constexpr (Bits == kQ4XS) {  // d * (ls - 32), centred: the int8 ls - 32 follow the codes
          const float d = ScaleValue(s[(g * super_blocks + b / kQSuperBlocks) * kQGroup + r]) *
                          static_cast<float>(static_cast<int8_t>(block[kQCodeBytesOf<Bits> + r]));
          Row(block, d, -kQMiddleOf<Bits> * d, r, columns, row);
        } else if constexpr (kQSuperBlockDMOf<Bits>) {  // d * sc and -dmin * mn: sub-scales and mins follow the codes
          const ScaleT* sb = s + (g * super_blocks + b / kQSuperBlocks) * 2 * kQGroup + r;
          const uint8_t* sub = block + kQCodeBytesOf<Bits>;
          Row(block, ScaleValue(sb[0]) * static_cast<float>(sub[r]),
              ScaleValue(sb[kQGroup]) * static_cast<float>(sub[kQGroup + r]), r, columns, row);
        } else if constexpr (kQCentredOf<Bits>) {  // m = -middle * d
          const float d = ScaleValue(s[(g * KB + b) * kQGroup + r]);
          Row(block, d, -kQMiddleOf<Bits> * d, r, columns, row);
        } else {
          const ScaleT* sb = s + (g * KB + b) * 2 * kQGroup + r;
          Row(block, ScaleValue(sb[0]), ScaleValue(sb[kQGroup]), r, columns, row);
        }
      }
    }
    return Ort::Status{nullptr};
  }

  // Row r of a block of 32 columns, d * q + m.
  static void Row(const uint8_t* block, float d, float m, int64_t r, int64_t columns, float* row) {
    for (int64_t i = 0; i < columns; ++i) row[i] = d * static_cast<float>(Code(block, r, i)) + m;
  }

  // MatMulQ3K's and Q6K's row r: (d * sc) * (q - middle); MatMulQ2K's (d * sc) * q + (-dmin * mn), the sc and mn u8
  // nibbles: as gguf's dequantiser forms them.
  static void Sub16Row(const uint8_t* block, float d, float minus_dmin, int64_t r, int64_t columns, float* row) {
    for (int64_t i = 0; i < columns; ++i) {
      const uint8_t byte = block[kQSubScalesOf<Bits> + kQGroup * (i / 16) + r];
      const float code = static_cast<float>(Code(block, r, i) - kQMiddleOf<Bits>);
      if constexpr (kQSub16MinsOf<Bits>)
        row[i] = d * static_cast<float>(byte & 0x0F) * code + minus_dmin * static_cast<float>(byte >> 4);
      else
        row[i] = d * static_cast<float>(static_cast<int8_t>(byte)) * code;
    }
  }

  // The code of row r and column i of a block: lane 4r + i % 4 of vector i / 4.
  static int32_t Code(const uint8_t* block, int64_t r, int64_t i) {
    const int64_t q = i / 4, lane = 4 * r + i % 4;
    constexpr int kCode = kQCodeOf<Bits>;
    if constexpr (kCode == 8) return block[64 * q + lane];
    if constexpr (kCode == kQ2K) return (block[64 * (q % 2) + lane] >> (2 * (q / 2))) & 3;
    if constexpr (kCode == kQ3K)
      return ((block[64 * (q % 2) + lane] >> (2 * (q / 2))) & 3) | ((block[kQ3KThirdBits + 8 * q + lane / 8] >> (lane % 8)) & 1) << 2;
    int32_t code = q < 4 ? block[64 * q + lane] & 0x0F : block[64 * (q - 4) + lane] >> 4;
    if constexpr (kCode == 5 || kCode == kQ6K) code |= ((block[kQ4BlockBytes + 8 * q + lane / 8] >> (lane % 8)) & 1) << 4;
    if constexpr (kCode == kQ6K) code |= ((block[kQ6KSixthBits + 8 * q + lane / 8] >> (lane % 8)) & 1) << 5;
    if constexpr (kCode == kQ4NL) code = kQ4NLCodes[code];
    return code;
  }

  static Ort::Status Error(const std::string& msg) {
    return Ort::Status(("GatherQ" + QSuffix(Bits) + ": " + msg).c_str(), ORT_INVALID_ARGUMENT);
  }

  int64_t N_, K_;
};

}  // namespace

namespace ortserve {

std::vector<Ort::Custom::OrtLiteCustomOp*> GatherQOps() { return QuantizedKernels<GatherQ>("GatherQ"); }

}  // namespace ortserve
