// How many of each AVX2 instruction MatMulQ's and MatMulF's kernels lean on one core retires per
// cycle: the multiplies (vpmaddubsw: 32 int8 multiply-adds, vpmaddwd: 16 int16, vfmadd231ps: 8
// float), the int16 add that follows each vpmaddubsw, and the broadcast load that feeds it. The
// cycle is calibrated by a chain of dependent vpaddd (latency 1). benchmarks/tables/avx2_zen3.md
// quotes it; not part of the package (it needs a compiler):
//
//   g++ -O2 -mavx2 -mfma benchmarks/port_throughput.cc -o /tmp/port_throughput && taskset -c 0 /tmp/port_throughput
#include <immintrin.h>

#include <chrono>
#include <cstdio>

namespace {

constexpr long kIterations = 20000000;

template <class F>
double BestSeconds(F body) {
  double best = 1e9;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    body();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = s < best ? s : best;
  }
  return best;
}

// 12 independent instructions an iteration: inputs ymm8/ymm9, results ymm0-7, ymm10-13.
#define TWELVE(ins)                                                                                     \
  asm volatile(ins " %%ymm8,%%ymm9,%%ymm0\n\t" ins " %%ymm8,%%ymm9,%%ymm1\n\t" ins " %%ymm8,%%ymm9,%%ymm2\n\t" \
               ins " %%ymm8,%%ymm9,%%ymm3\n\t" ins " %%ymm8,%%ymm9,%%ymm4\n\t" ins " %%ymm8,%%ymm9,%%ymm5\n\t"    \
               ins " %%ymm8,%%ymm9,%%ymm6\n\t" ins " %%ymm8,%%ymm9,%%ymm7\n\t" ins " %%ymm8,%%ymm9,%%ymm10\n\t"   \
               ins " %%ymm8,%%ymm9,%%ymm11\n\t" ins " %%ymm8,%%ymm9,%%ymm12\n\t" ins " %%ymm8,%%ymm9,%%ymm13"   \
               :::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm10", "xmm11", "xmm12", "xmm13")

}  // namespace

int main() {
  const double chain = BestSeconds([] {
    __m256i a = _mm256_set1_epi32(1);
    const __m256i b = _mm256_set1_epi32(3);
    for (long i = 0; i < kIterations; ++i)
      asm volatile("vpaddd %1,%0,%0\n\tvpaddd %1,%0,%0\n\tvpaddd %1,%0,%0\n\tvpaddd %1,%0,%0" : "+x"(a) : "x"(b));
  });
  const double cycle = chain / (4.0 * kIterations);
  std::printf("clock (dependent vpaddd): %.2f GHz\n", 1e-9 / cycle);
  const auto report = [&](const char* name, double seconds, int per_iteration) {
    std::printf("%-34s %.2f per cycle\n", name, per_iteration * kIterations / (seconds / cycle));
  };
  report("vpmaddubsw ymm", BestSeconds([] { for (long i = 0; i < kIterations; ++i) TWELVE("vpmaddubsw"); }), 12);
  report("vpmaddwd ymm", BestSeconds([] { for (long i = 0; i < kIterations; ++i) TWELVE("vpmaddwd"); }), 12);
  report("vfmadd231ps ymm", BestSeconds([] { for (long i = 0; i < kIterations; ++i) TWELVE("vfmadd231ps"); }), 12);
  report("vpaddw ymm", BestSeconds([] { for (long i = 0; i < kIterations; ++i) TWELVE("vpaddw"); }), 12);
  alignas(32) static int source[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  report("vpbroadcastd ymm, m32", BestSeconds([] {
           for (long i = 0; i < kIterations; ++i)
             asm volatile(
                 "vpbroadcastd (%0),%%ymm0\n\tvpbroadcastd 4(%0),%%ymm1\n\tvpbroadcastd 8(%0),%%ymm2\n\t"
                 "vpbroadcastd 12(%0),%%ymm3\n\tvpbroadcastd 16(%0),%%ymm4\n\tvpbroadcastd 20(%0),%%ymm5" ::"r"(source)
                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5");
         }), 6);
  // MatMulQ's AVX2 inner step: a broadcast of 4 activation bytes, a vpmaddubsw against unpacked codes,
  // an int16 add; 4 independent chains, as the kernel keeps.
  report("broadcast + vpmaddubsw + vpaddw (steps)", BestSeconds([] {
           for (long i = 0; i < kIterations; ++i)
             asm volatile(
                 "vpbroadcastd (%0),%%ymm0\n\tvpmaddubsw %%ymm0,%%ymm8,%%ymm0\n\tvpaddw %%ymm0,%%ymm10,%%ymm10\n\t"
                 "vpbroadcastd 4(%0),%%ymm1\n\tvpmaddubsw %%ymm1,%%ymm9,%%ymm1\n\tvpaddw %%ymm1,%%ymm11,%%ymm11\n\t"
                 "vpbroadcastd 8(%0),%%ymm2\n\tvpmaddubsw %%ymm2,%%ymm8,%%ymm2\n\tvpaddw %%ymm2,%%ymm12,%%ymm12\n\t"
                 "vpbroadcastd 12(%0),%%ymm3\n\tvpmaddubsw %%ymm3,%%ymm9,%%ymm3\n\tvpaddw %%ymm3,%%ymm13,%%ymm13" ::"r"(
                     source)
                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm10", "xmm11", "xmm12", "xmm13");
         }), 4);
  return 0;
}
