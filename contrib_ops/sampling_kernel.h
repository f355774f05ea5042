// Interface between the sampler's entry point (sampling.cc) and its kernel (sampling_kernel.cc,
// compiled once per ISA). Nothing from the standard library beyond integer types: no inline function
// may be shared between builds of different ISAs.
#pragma once

#include <cstdint>

namespace ortserve {

// w = e^x for rows of x [rows, vocab], and the sums of w over consecutive chunks of `chunk` tokens
// (sums [rows, ceil(vocab / chunk)]; the last chunk may be shorter), in one pass.
#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
namespace avx512 { void ExpChunkSums(const float* x, float* w, float* sums, int64_t rows, int64_t vocab, int64_t chunk); }
namespace avx2 { void ExpChunkSums(const float* x, float* w, float* sums, int64_t rows, int64_t vocab, int64_t chunk); }
#endif
namespace generic { void ExpChunkSums(const float* x, float* w, float* sums, int64_t rows, int64_t vocab, int64_t chunk); }

}  // namespace ortserve
