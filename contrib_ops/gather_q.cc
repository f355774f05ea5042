// See gather_q.h. A lookup reads one row's bytes (4 of every 64), a few rows a step: no SIMD needed.
#include "gather_q.h"

#include "matmul_q_kernel.h"
#include "op_util.h"

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
    if (scales.Shape() != std::vector<int64_t>{G, KB, 2, kQGroup})
      return Error("scales must be " + ShapeText({G, KB, 2, kQGroup}) + ", got " + ShapeText(scales.Shape()));
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
    for (int64_t t = 0; t < T; ++t) {
      const int64_t g = ids[t] / kQGroup, r = ids[t] % kQGroup;
      for (int64_t b = 0; b < KB; ++b) {
        const uint8_t* block = c + (g * KB + b) * kBlockBytes;
        const ScaleT* sb = s + (g * KB + b) * 2 * kQGroup + r;
        const float d = ScaleValue(sb[0]), m = ScaleValue(sb[kQGroup]);
        for (int64_t i = 0; i < kQBlock && b * kQBlock + i < K_; ++i) {
          const int64_t q = i / 4, lane = 4 * r + i % 4;  // column 4q + i % 4: lane 4r + i % 4 of vector q
          int32_t code = Bits == 8 ? block[64 * q + lane]
                                   : (q < 4 ? block[64 * q + lane] & 0x0F : block[64 * (q - 4) + lane] >> 4);
          if (Bits == 5) code |= ((block[kQ4BlockBytes + 8 * q + lane / 8] >> (lane % 8)) & 1) << 4;
          if (Bits == kQ4NL) code = kQ4NLCodes[code];
          out[t * K_ + b * kQBlock + i] = d * static_cast<float>(code) + m;
        }
      }
    }
    return Ort::Status{nullptr};
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
