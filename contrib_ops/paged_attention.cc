#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
extern "C" __attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions*, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  return nullptr;
}
