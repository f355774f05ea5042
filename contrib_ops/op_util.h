// Small helpers the ops' front ends share (compiled without ISA flags, so inline is safe here).
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"
#undef ORT_API_MANUAL_INIT

#include <cstdint>
#include <string>
#include <vector>

namespace ortserve {

// "[2, 3, 256]", for error messages.
inline std::string ShapeText(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
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

}  // namespace ortserve
