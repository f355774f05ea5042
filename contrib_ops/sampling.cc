// The sampler's one-pass exp and chunk sums (sampling_kernel.h) as a plain C function of the op
// library, which ortserve/ops/sampling.py calls through ctypes: the engine's random sampling spends
// most of its time in this pass over the vocabulary (benchmarks/tables/python_share.md).
#include "isa.h"
#include "sampling_kernel.h"

namespace {

using namespace ortserve;
using Fn = void (*)(const float*, float*, float*, int64_t, int64_t, int64_t);

Fn PickKernel() {
#ifdef ORTSERVE_GENERIC_KERNEL_ONLY
  return generic::ExpChunkSums;
#else
  return PickBuild<Fn>(avx512::ExpChunkSums, avx2::ExpChunkSums, generic::ExpChunkSums);
#endif
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void OrtserveExpChunkSums(const float* x, float* w, float* sums,
                                                                            int64_t rows, int64_t vocab,
                                                                            int64_t chunk) {
  PickKernel()(x, w, sums, rows, vocab, chunk);
}
