// See append_block_sums.h; the numpy reference is append_block_sums() in paged_attention_reference.py.
#include "append_block_sums.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using Ort::Custom::Tensor;

struct AppendBlockSums {
  AppendBlockSums(const OrtApi* api, const OrtKernelInfo* info) {
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, "block_size", &block_size_)) {
      api->ReleaseStatus(st);
      block_size_ = 0;
    }
  }

  Ort::Status Compute(const Tensor<float>& x, Tensor<float>& y) {
    if (block_size_ <= 0)
      return Error("attribute 'block_size' is required and must be > 0 (got " + std::to_string(block_size_) + ")");
    const std::vector<int64_t>& shape = x.Shape();
    if (shape.size() != 2) return Error("x must be 2-D [tokens, K]; got rank " + std::to_string(shape.size()));
    const int64_t rows = shape[0], k = shape[1];
    if (k % block_size_ != 0)
      return Error("x has K = " + std::to_string(k) + " columns, not a multiple of block_size = " +
                   std::to_string(block_size_));
    const int64_t blocks = k / block_size_, width = k + blocks;
    float* out = y.Allocate({rows, width});
    const float* in = x.Data();
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = in + r * k;
      float* dst = out + r * width;
      std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(k));
      for (int64_t b = 0; b < blocks; ++b) {
        float sum = 0.f;
        for (int64_t i = 0; i < block_size_; ++i) sum += src[b * block_size_ + i];
        dst[k + b] = sum;
      }
    }
    return Ort::Status{nullptr};
  }

  static Ort::Status Error(const std::string& msg) {
    return Ort::Status(("AppendBlockSums: " + msg).c_str(), ORT_INVALID_ARGUMENT);
  }

  int64_t block_size_ = 0;
};

}  // namespace

namespace ortserve {

Ort::Custom::OrtLiteCustomOp* AppendBlockSumsOp() {
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op{
      Ort::Custom::CreateLiteCustomOp<AppendBlockSums>("AppendBlockSums", "CPUExecutionProvider", 1)};
  return op.get();
}

}  // namespace ortserve
