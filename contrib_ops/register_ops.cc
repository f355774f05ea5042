// The library's entry point: every op of domain "ortserve" (ONNX op set 1). An artifact's
// op_version (ortserve.json) names the ops its graph needs:
//   1: PagedAttention;  2: + AppendBlockSums;  3: + PackedPagedAttention, GatedActivation;
//   4: + AddBlockOffsets;  5: + its fp16 offsets;  6: + MatMulQ4, MatMulQ8, GatherQ4, GatherQ8;
//   7: + MatMulQ5, GatherQ5;  8: + MatMulF;  9: + the linears' input stage;  10: + MatMulQ4NL, GatherQ4NL;
//   11: + MatMulQ6K, GatherQ6K;  12: + MatMulQ4K, MatMulQ5K, GatherQ4K, GatherQ5K;
//   13: + the centred MatMulQ4S, Q5S, Q8S, Q4NLS and their GatherQ;  14: + MatMulQ3K, GatherQ3K;
//   15: + MatMulQ4XS, GatherQ4XS;  16: + MatMulQ2K, GatherQ2K
#include <memory>
#include <mutex>
#include <vector>

#include "append_block_sums.h"
#include "block_offsets.h"
#include "gated_activation.h"
#include "gather_q.h"
#include "matmul_f.h"
#include "matmul_q.h"
#include "paged_attention.h"

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  // The domains must outlive every session that uses them.
  static std::vector<Ort::CustomOpDomain> domains;
  static std::mutex mutex;
  try {
    std::lock_guard<std::mutex> lock(mutex);
    Ort::CustomOpDomain domain{"ortserve"};
    domain.Add(ortserve::PagedAttentionOp());
    for (Ort::Custom::OrtLiteCustomOp* op : ortserve::PackedPagedAttentionOps()) domain.Add(op);
    domain.Add(ortserve::AppendBlockSumsOp());
    domain.Add(ortserve::GatedActivationOp());
    for (Ort::Custom::OrtLiteCustomOp* op : ortserve::AddBlockOffsetsOps()) domain.Add(op);
    for (Ort::Custom::OrtLiteCustomOp* op : ortserve::MatMulQOps()) domain.Add(op);
    for (Ort::Custom::OrtLiteCustomOp* op : ortserve::GatherQOps()) domain.Add(op);
    domain.Add(ortserve::MatMulFOp());
    Ort::UnownedSessionOptions(options).Add(domain);
    domains.push_back(std::move(domain));
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
  return nullptr;
}
