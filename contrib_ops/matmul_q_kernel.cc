// MatMulQ kernels (see matmul_q_kernel.h), compiled once per ISA. Per block of 32 columns and
// group of 16 weight rows, the integer dot products of the 4-, 5- or 8-bit codes with the int8 activations
// run with one int32 lane per weight row (AVX-512 VNNI: vpdpbusd; AVX2: vpmaddubsw + vpmaddwd on 4-bit
// halves, so the int16 sums cannot saturate), then
//   acc[row] += dot * (d[row] * dx) + m[row] * (dx * sum(xq))     // w = d * q + m, x ~ dx * xq
// in float. Lanes are weight rows, so no horizontal sums: a group's 16 outputs are one vector.
// Up to kTileRows activation rows share each unpacked block of codes (prefill chunks, batched decode).
// With 16-bit activations each row of x is two int8 rows, its codes and the residual's, whose
// results are added as they are stored.
#include "matmul_q_kernel.h"

#ifndef ORTSERVE_ISA
#error "compile with -DORTSERVE_ISA=avx512|avx2|generic"
#endif

#if defined(__AVX2__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized reports
// wherever they are inlined: a false positive of the compiler's own headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

#define ALWAYS_INLINE inline __attribute__((always_inline))

namespace ortserve {
namespace ORTSERVE_ISA {

namespace {

#include "simd_math.h"  // HalfToFloat, HalvesToFloats: in this ISA's namespace

ALWAYS_INLINE int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }

constexpr int64_t BlockBytes(int bits) { return bits == 4 ? kQ4BlockBytes : bits == 5 ? kQ5BlockBytes : kQ8BlockBytes; }

// One block's quantisation: dx and the codes' sum follow from amax (see the header).
ALWAYS_INLINE void BlockScales(float amax, int32_t sum, float* s) {
  const float dx = amax / 127.f;
  s[0] = dx;
  s[1] = dx * static_cast<float>(sum);
}

ALWAYS_INLINE float Inverse(float amax) { return amax > 0.f ? 127.f / amax : 0.f; }

// A block of up to 32 values of x, zero-padded to 32.
ALWAYS_INLINE const float* Block32(const float* x, int64_t n, float* pad) {
  if (n == kQBlock) return x;
  for (int64_t i = 0; i < kQBlock; ++i) pad[i] = i < n ? x[i] : 0.f;
  return pad;
}

ALWAYS_INLINE int32_t Load32(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

#if defined(__AVX2__)
// Decode reads every weight once per call, group after group, and the hardware prefetchers alone
// keep too few lines in flight for one core's stream (SmolLM2-135M int4 decode read its weights at
// about 13 GB/s of the 28-30 GB/s two cores can). So the tile loops ask for the codes and scales
// kPrefetchBytes of codes ahead: past the group's end that is the next group's, which follows it.
// (1, 2, 4 and 8 KiB ahead: 4 KiB was best, benchmarks/tables/matmul_prefetch.md.)
constexpr int64_t kPrefetchBytes = 4096;

template <int Bits, typename S>
ALWAYS_INLINE void PrefetchAhead(const uint8_t* block_codes, const S* block_scales) {
  const char* codes = reinterpret_cast<const char*>(block_codes + kPrefetchBytes);
  for (int64_t line = 0; line < BlockBytes(Bits); line += 64) _mm_prefetch(codes + line, _MM_HINT_T0);
  const char* scales = reinterpret_cast<const char*>(block_scales + kPrefetchBytes / BlockBytes(Bits) * 2 * kQGroup);
  for (int64_t line = 0; line < static_cast<int64_t>(2 * kQGroup * sizeof(S)); line += 64) _mm_prefetch(scales + line, _MM_HINT_T0);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
constexpr int kTileRows = 8;

ALWAYS_INLINE float BlockAmax(const float* in) {
  const __m512 a = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(in)), _mm512_abs_ps(_mm512_loadu_ps(in + 16)));
  return _mm512_reduce_max_ps(a);
}

ALWAYS_INLINE int32_t QuantizeAt(const float* in, float inverse, int8_t* out) {
  const __m512 id = _mm512_set1_ps(inverse);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  __m512i q[2];
  for (int j = 0; j < 2; ++j) {
    q[j] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(in + 16 * j), id));
    q[j] = _mm512_min_epi32(_mm512_max_epi32(q[j], lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * j), _mm512_cvtsepi32_epi8(q[j]));
  }
  return _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
}

template <typename S>
ALWAYS_INLINE __m512 Load16(const S* p) {
  if constexpr (sizeof(S) == 2) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  else return _mm512_loadu_ps(p);
}

// A block's integer dot products with one row of x: 16 weight rows, one int32 lane each.
ALWAYS_INLINE __m512i BlockDot(const __m512i* w, const int8_t* xb) {
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();  // two chains: half the latency
  for (int q = 0; q < 8; q += 2) {
    s0 = _mm512_dpbusd_epi32(s0, w[q], _mm512_set1_epi32(Load32(xb + 4 * q)));
    s1 = _mm512_dpbusd_epi32(s1, w[q + 1], _mm512_set1_epi32(Load32(xb + 4 * q + 4)));
  }
  return _mm512_add_epi32(s0, s1);
}

// Rows [0, MT) of x against one group: y[i, 0..valid) for each row i (Pairs: y[i / 2] from rows i and
// i + 1, an activation row and its residual, whose dot products add as integers: 256 * hi + lo).
template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRows(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                             const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                             int64_t KB, int64_t valid) {
  static_assert(!Pairs || MT % 2 == 0, "a pair is two rows");
  constexpr int kStep = Pairs ? 2 : 1, kOut = MT / kStep;
  __m512 acc[kOut];
  for (int o = 0; o < kOut; ++o) acc[o] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* c = codes + b * BlockBytes(Bits);
    PrefetchAhead<Bits>(c, scales + b * 2 * kQGroup);
    __m512i w[8];  // w[q]: 16 rows x columns 4q..4q+3 of the block
    if constexpr (Bits == 4 || Bits == 5) {
      for (int j = 0; j < 4; ++j) {
        const __m512i raw = _mm512_loadu_si512(c + 64 * j);
        w[j] = _mm512_and_si512(raw, nibble);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
      }
      if constexpr (Bits == 5) {  // the fifth bits: one 64-bit lane mask per vector
        const __m512i sixteen = _mm512_set1_epi8(16);
        for (int q = 0; q < 8; ++q) {
          uint64_t fifth;
          __builtin_memcpy(&fifth, c + kQ4BlockBytes + 8 * q, 8);
          w[q] = _mm512_or_si512(w[q], _mm512_maskz_mov_epi8(fifth, sixteen));
        }
      }
    } else {
      for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(c + 64 * j);
    }
    const __m512 d = Load16(scales + b * 2 * kQGroup), m = Load16(scales + b * 2 * kQGroup + kQGroup);
    for (int o = 0; o < kOut; ++o) {
      const int64_t i = o * kStep;
      const int8_t* xb = xq + i * xq_stride + b * kQBlock;
      const float* sc = xs + i * xs_stride + 2 * b;
      __m512i dot = BlockDot(w, xb);
      float dx = sc[0], sum = sc[1];
      if constexpr (Pairs) {  // the residual's scale: dx / 256
        dot = _mm512_add_epi32(_mm512_slli_epi32(dot, kResidualShift), BlockDot(w, xb + xq_stride));
        dx = sc[xs_stride], sum += sc[xs_stride + 1];
      }
      acc[o] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[o]);
      acc[o] = _mm512_fmadd_ps(m, _mm512_set1_ps(sum), acc[o]);
    }
  }
  const __mmask16 mask = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
  const __m512 add = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int o = 0; o < kOut; ++o) _mm512_mask_storeu_ps(y + o * y_stride, mask, _mm512_add_ps(acc[o], add));
}

#elif defined(__AVX2__)
constexpr int kTileRows = 8;

ALWAYS_INLINE float HorizontalMax(__m256 v) {
  __m128 r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)));
}

ALWAYS_INLINE int32_t HorizontalSum(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32(r, 0xB1)));
}

ALWAYS_INLINE float BlockAmax(const float* in) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 a = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(in + 8 * j)));
  return HorizontalMax(a);
}

ALWAYS_INLINE int32_t QuantizeAt(const float* in, float inverse, int8_t* out) {
  const __m256 id = _mm256_set1_ps(inverse);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i q[4];
  for (int j = 0; j < 4; ++j) {
    q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(in + 8 * j), id));
    q[j] = _mm256_min_epi32(_mm256_max_epi32(q[j], lo), hi);
  }
  // int32 -> int8; the two packs interleave 128-bit lanes, the permute restores order
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
  return HorizontalSum(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
}

template <typename S>
ALWAYS_INLINE __m256 Load8(const S* p) {
  if constexpr (sizeof(S) == 2) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  else return _mm256_loadu_ps(p);
}

// Bytes 0 or 16: byte i is bit i of ``bits``, as bit 4 (a 5-bit code's fifth bit).
ALWAYS_INLINE __m256i FifthBits(uint32_t bits) {
  const __m256i byte_of_bit = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bit_of_byte = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)), byte_of_bit);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// As the AVX-512 build, one half of the group (8 rows) at a time. vpmaddubsw's int16 pair sums stay
// below 2^15 when the codes are 4-bit: 8 of them add at most 16 * 15 * 127 = 30480; 5-bit codes (the
// nibbles with their fifth bits OR-ed in) go in two sums of 4 each, at most 8 * 31 * 127 = 31496.
// 8-bit codes are taken as two 4-bit halves, hi * 16 + lo, each summed apart; with 16-bit activations
// they meet the activations' 16-bit codes in vpmaddwd instead (WideDot), one pass for the pair.
// A block's codes are unpacked once, then each row of x streams past them in two short chains of
// int16 sums: 4- and 5-bit codes as 8 vectors that stay in registers, 8-bit codes as 16 vectors of
// nibbles that do not fit and are read back from L1 (GCC had scheduled the older loops, which kept
// a pair of sums per row instead, into hundreds of stack spills). The int16 sums become int32 in
// vpmaddwd against ``unit``: 1, or 256 for the first row of a pair.
template <int Bits>
ALWAYS_INLINE __m256i BlockDot(const __m256i* w, const int8_t* xb, __m256i unit) {
  __m256i s0 = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(Load32(xb)));
  __m256i s1 = _mm256_maddubs_epi16(w[4], _mm256_set1_epi32(Load32(xb + 16)));
  for (int q = 1; q < 4; ++q) {
    s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(w[q], _mm256_set1_epi32(Load32(xb + 4 * q))));
    s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(w[q + 4], _mm256_set1_epi32(Load32(xb + 16 + 4 * q))));
  }
  if constexpr (Bits == 4) return _mm256_madd_epi16(_mm256_add_epi16(s0, s1), unit);
  return _mm256_add_epi32(_mm256_madd_epi16(s0, unit), _mm256_madd_epi16(s1, unit));
}

// 8-bit codes against a pair's 16-bit activation codes 256 * hi + lo (|.| <= 32639, so a block's sums
// stay below 32 * 255 * 32639 < 2^31). wide[p]: the half's 8 rows x columns 2p, 2p + 1 as int16, a
// row a 32-bit lane (WideCodes), so vpmaddwd against a broadcast column pair leaves each row's sum in
// its own lane. The pair's codes go through memory on purpose: a broadcast from memory is a load,
// where GCC's broadcasts from a register took a shuffle each, on the port that vpshufb needs too.
ALWAYS_INLINE void WideCodes(const uint8_t* c, __m256i* wide) {
  // vpshufb picks bytes within 16-byte lanes; 0x80 (and 0x80 + the lane's offset) writes a zero
  const __m256i lane = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C);
  const __m256i lo = _mm256_add_epi8(_mm256_set1_epi32(static_cast<int32_t>(0x80018000u)), lane);  // bytes 0, 1
  const __m256i hi = _mm256_add_epi8(_mm256_set1_epi32(static_cast<int32_t>(0x80038002u)), lane);  // bytes 2, 3
  for (int q = 0; q < 8; ++q) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * q));
    wide[2 * q] = _mm256_shuffle_epi8(raw, lo), wide[2 * q + 1] = _mm256_shuffle_epi8(raw, hi);
  }
}

ALWAYS_INLINE __m256i WideDot(const __m256i* wide, const int8_t* hi, const int8_t* lo) {
  alignas(32) int16_t x[kQBlock];
  for (int j = 0; j < 2; ++j) {
    const auto load = [&](const int8_t* p) {
      return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j)));
    };
    const __m256i code = _mm256_add_epi16(_mm256_slli_epi16(load(hi), kResidualShift), load(lo));
    _mm256_store_si256(reinterpret_cast<__m256i*>(x + 16 * j), code);
  }
  __asm__ volatile("" : : "r"(x) : "memory");  // keep the broadcasts below as loads
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
  const int8_t* pairs = reinterpret_cast<const int8_t*>(x);  // column pair p: bytes 4p..4p+3
  for (int p = 0; p < 16; p += 2) {
    even = _mm256_add_epi32(even, _mm256_madd_epi16(wide[p], _mm256_set1_epi32(Load32(pairs + 4 * p))));
    odd = _mm256_add_epi32(odd, _mm256_madd_epi16(wide[p + 1], _mm256_set1_epi32(Load32(pairs + 4 * p + 4))));
  }
  return _mm256_add_epi32(even, odd);
}

// Rows [0, MT) of x against one group, as the AVX-512 build's (Pairs: y[i / 2] from rows i and i + 1).
template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRows(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                             const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                             int64_t KB, int64_t valid) {
  static_assert(!Pairs || MT % 2 == 0, "a pair is two rows");
  constexpr int kStep = Pairs ? 2 : 1, kOut = MT / kStep;
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
  const __m256i coarse = _mm256_set1_epi16(1 << kResidualShift);
  for (int64_t h = 0; h < 2 && 8 * h < valid; ++h) {
    __m256 acc[kOut];
    for (int o = 0; o < kOut; ++o) acc[o] = _mm256_setzero_ps();
    for (int64_t b = 0; b < KB; ++b) {
      const uint8_t* c = codes + b * BlockBytes(Bits) + 32 * h;
      if (h == 0) PrefetchAhead<Bits>(c, scales + b * 2 * kQGroup);  // the second half finds them in cache
      const int8_t* xb = xq + b * kQBlock;
      __m256i sums[kOut];
      if constexpr (Bits != 8) {
        __m256i w[8];  // w[q]: 8 rows x columns 4q..4q+3 of the block
        for (int j = 0; j < 4; ++j) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j));
          w[j] = _mm256_and_si256(raw, nibble), w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
        }
        if constexpr (Bits == 5) {
          const uint8_t* fifth = codes + b * BlockBytes(Bits) + kQ4BlockBytes + 4 * h;
          for (int q = 0; q < 8; ++q) {
            uint32_t bits;
            __builtin_memcpy(&bits, fifth + 8 * q, 4);
            w[q] = _mm256_or_si256(w[q], FifthBits(bits));
          }
        }
        for (int o = 0; o < kOut; ++o) {
          const int8_t* row = xb + o * kStep * xq_stride;
          if constexpr (Pairs)
            sums[o] = _mm256_add_epi32(BlockDot<Bits>(w, row, coarse), BlockDot<Bits>(w, row + xq_stride, ones));
          else
            sums[o] = BlockDot<Bits>(w, row, ones);
        }
      } else if constexpr (Pairs) {
        __m256i wide[16];
        WideCodes(c, wide);
        for (int o = 0; o < kOut; ++o) sums[o] = WideDot(wide, xb + 2 * o * xq_stride, xb + (2 * o + 1) * xq_stride);
      } else {
        __m256i halves[16];  // [2j]: low nibbles of vector j (columns 4j..4j+3), [2j + 1]: high nibbles
        for (int j = 0; j < 8; ++j) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j));
          halves[2 * j] = _mm256_and_si256(raw, nibble);
          halves[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
        }
        for (int o = 0; o < kOut; ++o) {  // two int16 chains a row: the low and the high nibbles' sums
          const int8_t* row = xb + o * xq_stride;
          __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
          for (int j = 0; j < 8; ++j) {
            const __m256i x = _mm256_set1_epi32(Load32(row + 4 * j));
            low = _mm256_add_epi16(low, _mm256_maddubs_epi16(halves[2 * j], x));
            high = _mm256_add_epi16(high, _mm256_maddubs_epi16(halves[2 * j + 1], x));
          }
          sums[o] = _mm256_add_epi32(_mm256_madd_epi16(low, ones), _mm256_madd_epi16(high, sixteen));
        }
      }
      const S* sb = scales + b * 2 * kQGroup + 8 * h;
      const __m256 d = Load8(sb), m = Load8(sb + kQGroup);
      for (int o = 0; o < kOut; ++o) {
        const float* sc = xs + o * kStep * xs_stride + 2 * b;
        float dx = sc[0], sum = sc[1];
        if constexpr (Pairs) dx = sc[xs_stride], sum += sc[xs_stride + 1];  // the residual's scale: dx / 256
        acc[o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[o]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[o]);
        acc[o] = _mm256_fmadd_ps(m, _mm256_set1_ps(sum), acc[o]);
      }
    }
    const int64_t n = MinI(8, valid - 8 * h);
    for (int o = 0; o < kOut; ++o) {
      float out[8];
      _mm256_storeu_ps(out, acc[o]);
      float* row = y + o * y_stride + 8 * h;
      for (int64_t r = 0; r < n; ++r) row[r] = out[r] + (bias ? bias[8 * h + r] : 0.f);
    }
  }
}

#else
constexpr int kTileRows = 2;

ALWAYS_INLINE float BlockAmax(const float* in) {
  float amax = 0.f;
  for (int64_t i = 0; i < kQBlock; ++i) amax = __builtin_fmaxf(amax, __builtin_fabsf(in[i]));
  return amax;
}

ALWAYS_INLINE int32_t QuantizeAt(const float* in, float inverse, int8_t* out) {
  int32_t sum = 0;
  for (int64_t i = 0; i < kQBlock; ++i) {
    const float v = __builtin_fminf(__builtin_fmaxf(__builtin_rintf(in[i] * inverse), -127.f), 127.f);
    out[i] = static_cast<int8_t>(v);
    sum += out[i];
  }
  return sum;
}

// The code of row r and column 4q + j of the block at c.
template <int Bits>
ALWAYS_INLINE int32_t Code(const uint8_t* c, int64_t r, int64_t q, int64_t j) {
  if constexpr (Bits == 8) return c[64 * q + 4 * r + j];
  const uint8_t byte = c[64 * (q % 4) + 4 * r + j];
  const int32_t low = q < 4 ? byte & 0x0F : byte >> 4;
  if constexpr (Bits == 4) return low;
  const int64_t lane = 4 * r + j;
  return low | (((c[kQ4BlockBytes + 8 * q + lane / 8] >> (lane % 8)) & 1) << 4);
}

template <typename S>
ALWAYS_INLINE float Scale(const S* p) {
  if constexpr (sizeof(S) == 2) return HalfToFloat(*p);
  else return *p;
}

template <int Bits, typename S, int MT, bool Pairs>
ALWAYS_INLINE void GroupRows(const uint8_t* codes, const S* scales, const int8_t* xq, int64_t xq_stride,
                             const float* xs, int64_t xs_stride, const float* bias, float* y, int64_t y_stride,
                             int64_t KB, int64_t valid) {
  for (int64_t r = 0; r < valid; ++r) {
    float acc[MT] = {};
    for (int i = 0; i < MT; ++i)
      for (int64_t b = 0; b < KB; ++b) {
        const uint8_t* c = codes + b * BlockBytes(Bits);
        const int8_t* xb = xq + i * xq_stride + b * kQBlock;
        int32_t dot = 0;
        for (int64_t q = 0; q < 8; ++q)
          for (int64_t j = 0; j < 4; ++j) dot += Code<Bits>(c, r, q, j) * xb[4 * q + j];
        const S* sb = scales + b * 2 * kQGroup + r;
        const float* sc = xs + i * xs_stride + 2 * b;
        acc[i] += static_cast<float>(dot) * (Scale(sb) * sc[0]);
        acc[i] += Scale(sb + kQGroup) * sc[1];
      }
    const float add = bias ? bias[r] : 0.f;
    if constexpr (Pairs) {
      for (int i = 0; i + 1 < MT; i += 2) y[i / 2 * y_stride + r] = acc[i] + acc[i + 1] + add;
    } else {
      for (int i = 0; i < MT; ++i) y[i * y_stride + r] = acc[i] + add;
    }
  }
}
#endif

template <int Bits, typename S, int MT, bool Pairs>
void TileRows(const uint8_t* codes, const S* scales, const int8_t* xq, const float* xs, const float* bias, float* y,
              int64_t KB, int64_t N, int64_t t, int64_t g0, int64_t g1) {
  const int64_t xq_stride = KB * kQBlock, xs_stride = 2 * KB;
  float* y_rows = y + (Pairs ? t / 2 : t) * N;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t n0 = g * kQGroup;
    GroupRows<Bits, S, MT, Pairs>(codes + g * KB * BlockBytes(Bits), scales + g * KB * 2 * kQGroup,
                                  xq + t * xq_stride, xq_stride, xs + t * xs_stride, xs_stride,
                                  bias ? bias + n0 : nullptr, y_rows + n0, N, KB, MinI(kQGroup, N - n0));
  }
}

// The last rows < kTileRows of a range, in one pass over the weights (Pairs: an even count).
template <int Bits, typename S, int MT, bool Pairs>
void LastRows(const uint8_t* codes, const S* scales, const int8_t* xq, const float* xs, const float* bias, float* y,
              int64_t KB, int64_t N, int64_t t, int64_t rows, int64_t g0, int64_t g1) {
  constexpr int kStep = Pairs ? 2 : 1;
  if constexpr (MT > kStep) {
    if (rows < MT) return LastRows<Bits, S, MT - kStep, Pairs>(codes, scales, xq, xs, bias, y, KB, N, t, rows, g0, g1);
  }
  if constexpr (MT >= 1) TileRows<Bits, S, MT, Pairs>(codes, scales, xq, xs, bias, y, KB, N, t, g0, g1);
}

template <int Bits, typename S, bool Pairs>
void Tile(const uint8_t* codes, const S* scales, const int8_t* xq, const float* xs, const float* bias, float* y,
          int64_t KB, int64_t N, int64_t t0, int64_t t1, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {  // a group's codes stay in L1 while every tile of rows passes
    int64_t t = t0;
    for (; t + kTileRows <= t1; t += kTileRows)
      TileRows<Bits, S, kTileRows, Pairs>(codes, scales, xq, xs, bias, y, KB, N, t, g, g + 1);
    constexpr int kLast = kTileRows - (Pairs ? 2 : 1);  // the most rows a last tile can have
    if (t < t1) LastRows<Bits, S, kLast, Pairs>(codes, scales, xq, xs, bias, y, KB, N, t, t1 - t, g, g + 1);
  }
}

template <int Bits, typename S>
void TileOf(const uint8_t* codes, const S* scales, bool pairs, const int8_t* xq, const float* xs, const float* bias,
            float* y, int64_t KB, int64_t N, int64_t t0, int64_t t1, int64_t g0, int64_t g1) {
  if (pairs)
    Tile<Bits, S, true>(codes, scales, xq, xs, bias, y, KB, N, t0, t1, g0, g1);
  else
    Tile<Bits, S, false>(codes, scales, xq, xs, bias, y, KB, N, t0, t1, g0, g1);
}

template <int Bits>
void TileOfBits(const uint8_t* codes, const void* scales, bool half, bool pairs, const int8_t* xq, const float* xs,
                const float* bias, float* y, int64_t KB, int64_t N, int64_t t0, int64_t t1, int64_t g0, int64_t g1) {
  if (half)
    TileOf<Bits>(codes, static_cast<const uint16_t*>(scales), pairs, xq, xs, bias, y, KB, N, t0, t1, g0, g1);
  else
    TileOf<Bits>(codes, static_cast<const float*>(scales), pairs, xq, xs, bias, y, KB, N, t0, t1, g0, g1);
}

// A row of x to int8 blocks and, with a residual, the part of each block the codes miss: x - dx * xq
// rounded once (fma), then quantised on the grid 256 times finer (see the header).
void QuantizeRow(const float* x, int64_t K, int64_t KB, bool residual, int8_t* xq, float* xs) {
  float pad[kQBlock], rest[kQBlock];
  for (int64_t b = 0; b < KB; ++b) {
    const int64_t k0 = b * kQBlock;
    const float* in = Block32(x + k0, MinI(kQBlock, K - k0), pad);
    const float amax = BlockAmax(in), inverse = Inverse(amax);
    BlockScales(amax, QuantizeAt(in, inverse, xq + k0), xs + 2 * b);
    if (!residual) continue;
    const float dx = xs[2 * b], fine = dx / kResidualSteps;
    for (int64_t i = 0; i < kQBlock; ++i) rest[i] = __builtin_fmaf(-dx, static_cast<float>(xq[k0 + i]), in[i]);
    const int32_t sum = QuantizeAt(rest, inverse * kResidualSteps, xq + KB * kQBlock + k0);
    xs[2 * KB + 2 * b] = fine;
    xs[2 * KB + 2 * b + 1] = fine * static_cast<float>(sum);
  }
}

}  // namespace

void QuantizeRows(const float* x, int64_t T, int64_t K, bool residual, int8_t* xq, float* xs) {
  const int64_t KB = (K + kQBlock - 1) / kQBlock, rows = residual ? 2 : 1;
  for (int64_t t = 0; t < T; ++t)
    QuantizeRow(x + t * K, K, KB, residual, xq + t * rows * KB * kQBlock, xs + t * rows * KB * 2);
}

void QTile(int bits, const uint8_t* codes, const void* scales, bool half, bool pairs, const int8_t* xq,
           const float* xs, const float* bias, float* y, int64_t KB, int64_t N, int64_t t0, int64_t t1, int64_t g0,
           int64_t g1) {
  if (bits == 4)
    TileOfBits<4>(codes, scales, half, pairs, xq, xs, bias, y, KB, N, t0, t1, g0, g1);
  else if (bits == 5)
    TileOfBits<5>(codes, scales, half, pairs, xq, xs, bias, y, KB, N, t0, t1, g0, g1);
  else
    TileOfBits<8>(codes, scales, half, pairs, xq, xs, bias, y, KB, N, t0, t1, g0, g1);
}

}  // namespace ORTSERVE_ISA
}  // namespace ortserve
