// Interface between the MatMulQ ops (matmul_q.cc) and their kernels (matmul_q_kernel.cc, compiled
// once per ISA). Nothing from the standard library beyond integer types: no inline function may be
// shared between builds of different ISAs.
//
// The weight layout (the numpy references pack_q, pack_qk and pack_sub16 in matmul_q_reference.py define it):
// W [N, K] as w = d * q + m, q in 0..15 (MatMulQ4), 0..31 (MatMulQ5) or 0..255 (MatMulQ8), one (d, m) per row and block
// of 32 columns along K. Rows are taken 16 at a time (a group; N is padded to whole groups with
// q = d = m = 0), blocks 32 columns at a time (K padded with q = 0):
//   codes  u8 [G, KB, 256] (4-bit): byte c * 64 + r * 4 + j of block b holds q[16g + r, 32b + 4c + j]
//          in its low nibble and q[16g + r, 32b + 16 + 4c + j] in its high one (c < 4, r < 16, j < 4);
//          u8 [G, KB, 320] (5-bit): the 4-bit layout of q & 15, then 64 bytes of the fifth bits: bit
//          i % 8 of byte 256 + 8c + i / 8 is bit 4 of the code in lane i = r * 4 + j of vector c, the
//          column 32b + 4c + j (c < 8; vectors c < 4 are the low nibbles, c >= 4 the high ones);
//          u8 [G, KB, 512] (8-bit): byte c * 64 + r * 4 + j holds q[16g + r, 32b + 4c + j] (c < 8);
//          MatMulQ4NL: the 4-bit layout, each nibble an index i into kQ4NLCodes, q = kQ4NLCodes[i] (GGUF's
//          IQ4_NL / IQ4_XS values + 128: 8-bit codes at 4 bits a weight, so the kernels run the 8-bit
//          arithmetic on codes looked up from nibbles).
//          MatMulQ6K (GGUF's Q6_K, w = d * sc * (q - 32), q in 0..63, an int8 sc per row and 16 columns, a d per
//          row and 256): u8 [G, KB, 416], the 5-bit layout of q & 31, then the sixth bits in the fifth bits'
//          layout (bytes 320..383), then the int8 sc of the group's 16 rows for columns 0..15 and for 16..31.
//          MatMulQ3K (GGUF's Q3_K, w = d * sc * (q - 4), q in 0..7, sc and d as MatMulQ6K's): u8 [G, KB, 224],
//          128 bytes of 2-bit fields: byte c * 64 + r * 4 + j holds q & 3 of vectors c, c + 2, c + 4 and c + 6
//          (columns 4v + j, v = c + 2p) at bits 2p (c < 2), then the third bits in the fifth bits' layout (bytes
//          128..191), then the sc as MatMulQ6K's (bytes 192..223).
//          MatMulQ2K (GGUF's Q2_K, w = d * sc * q - dmin * mn, q in 0..3, a u8 sc and mn (4 bits) per row and 16
//          columns, d and dmin per row and 256): u8 [G, KB, 160], MatMulQ3K's 128 bytes of 2-bit fields, then
//          sc | mn << 4 of the group's 16 rows for columns 0..15 and for 16..31. MatMulQ2K, Q3K and Q6K are the
//          "sub16" layouts.
//          MatMulQ4XS (GGUF's IQ4_XS, w = d * (ls - 32) * kvalue per row and 32 columns, d per row and 256): u8
//          [G, KB, 272], MatMulQ4NL's 4-bit layout, then the int8 ls - 32 of the group's 16 rows.
//          MatMulQ4K / MatMulQ5K (GGUF's Q4_K / Q5_K, w = d * sc * q - dmin * mn, u8 sc and mn (6 bits) per row and
//          32 columns, d and dmin per row and 256): u8 [G, KB, 288 | 352], the 4- or 5-bit layout of q, then the u8
//          sc of the group's 16 rows, then their mn; a block's d * sc and -dmin * mn are its d and m (exact in f32).
//          Either way a 64-byte load (and a nibble mask) gives 16 rows x 4 columns: an int32 lane a row.
//   scales f16 or f32 [G, KB, 2, 16]: d then m of the group's 16 rows; MatMulQ3K / Q6K: [G, ceil(KB / 8), 16], d;
//   MatMulQ4K / Q5K / Q2K: [G, ceil(KB / 8), 2, 16], d then -dmin; the centred MatMulQ4S / Q5S / Q8S / Q4NLS (the layouts
//   of MatMulQ4 / Q5 / Q8 / Q4NL, their codes centred: GGUF's Q4_0, Q5_0, Q8_0 + 128, IQ4_NL and IQ4_XS + 128):
//   [G, KB, 16], d, with m = -middle * d (middle 8, 16, 128, 128); MatMulQ4XS: [G, ceil(KB / 8), 16], d, the block's
//   d * (ls - 32) and m = -128 times that.
#pragma once

#include <cstdint>

namespace ortserve {

constexpr int64_t kQBlock = 32, kQGroup = 16, kQ4BlockBytes = 256, kQ5BlockBytes = 320, kQ8BlockBytes = 512;
constexpr int32_t kResidualShift = 8;  // 16-bit activations: the residual row's grid is 2^8 times finer
constexpr float kResidualSteps = 1 << kResidualShift;

// The kernels' Bits of MatMulQ4NL (4-bit indices of 8-bit codes), and its codes: llama.cpp's kvalues_iq4nl
// (-127 ... 113) + 128.
constexpr int kQ4NL = 0x14;
constexpr uint8_t kQ4NLCodes[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

// The kernels' Bits of MatMulQ6K; where its block's sixth bits and sub-block scales start.
constexpr int kQ6K = 0x16;
constexpr int64_t kQ6KBlockBytes = 416, kQ6KSixthBits = 320, kQ6KSubScales = 384;

// The kernels' Bits of MatMulQ3K; where its block's third bits and sub-block scales start.
constexpr int kQ3K = 0x13;
constexpr int64_t kQ3KBlockBytes = 224, kQ3KThirdBits = 128, kQ3KSubScales = 192;

// The kernels' Bits of MatMulQ2K; where its block's sub-scales and mins start (the block's end: 32 bytes later).
constexpr int kQ2K = 0x12;
constexpr int64_t kQ2KBlockBytes = 160, kQ2KSubScales = 128;

// The kernels' Bits of MatMulQ4K and MatMulQ5K; the bytes a block's sub-scales and mins add to its codes.
constexpr int kQ4K = 0x24, kQ5K = 0x25;
constexpr int64_t kQKSubBytes = 32;

// Blocks of 32 columns in a GGUF super-block (256 columns): MatMulQ3K's and Q6K's d, MatMulQ4K's, Q5K's and Q2K's d and
// dmin.
constexpr int64_t kQSuperBlocks = 8;

// The flag that makes MatMulQ4 / Q5 / Q8 / Q4NL's Bits those of the centred MatMulQ4S / Q5S / Q8S / Q4NLS.
constexpr int kQCentred = 0x100;

// The flag that makes a centred layout's d its super-block's d times the block's int8 sub-scales, which follow its
// codes (16 bytes: one a row): MatMulQ4XS (GGUF's IQ4_XS, d * (ls - 32) per row and block) is Q4NLS with it.
constexpr int kQSuperScaled = 0x200;
constexpr int kQ4XS = kQ4NL | kQCentred | kQSuperScaled;
constexpr int64_t kQXSSubBytes = 16;

// Constants, not functions: nothing here is compiled once per ISA.
// The layout a Bits reads its codes in: 4, 5, 8, kQ4NL, kQ2K, kQ3K or kQ6K (MatMulQ4K / Q5K: 4 and 5; centred: as
// uncentred; MatMulQ4XS: kQ4NL).
template <int Bits>
constexpr int kQCodeOf = (Bits & ~(kQCentred | kQSuperScaled)) == kQ4K   ? 4
                         : (Bits & ~(kQCentred | kQSuperScaled)) == kQ5K ? 5
                                                                         : Bits & ~(kQCentred | kQSuperScaled);
// MatMulQ2K, Q3K and Q6K: codes q - middle, a sub-scale per row and 16 columns, a d per row and 256 (MatMulQ2K: a
// min per row and 16 columns too, and a dmin per row and 256).
template <int Bits>
constexpr bool kQSub16Of = Bits == kQ2K || Bits == kQ3K || Bits == kQ6K;
// The sub16 layout with mins: its sub-scales are u8 nibbles, its mins the high nibbles of the same bytes.
template <int Bits>
constexpr bool kQSub16MinsOf = Bits == kQ2K;
// A centred layout's middle code: m = -middle * d; a sub16 layout's: w = d * sc * (q - middle).
template <int Bits>
constexpr int kQMiddleOf = kQCodeOf<Bits> == 4 ? 8
                           : kQCodeOf<Bits> == 5 ? 16
                           : Bits == kQ2K        ? 0
                           : Bits == kQ3K        ? 4
                           : Bits == kQ6K        ? 32
                                                 : 128;
// Where a sub16 block's sub-scales start (its codes end).
template <int Bits>
constexpr int64_t kQSubScalesOf = Bits == kQ2K ? kQ2KSubScales : Bits == kQ3K ? kQ3KSubScales : kQ6KSubScales;
// MatMulQ4K / Q5K: a block's d and m are its super-block's d and -dmin times its sub-scale and min; MatMulQ4XS: its d
// is its super-block's d times its int8 sub-scale.
template <int Bits>
constexpr bool kQSuperBlockDMOf = Bits == kQ4K || Bits == kQ5K || (Bits & kQSuperScaled) != 0;
template <int Bits>
constexpr bool kQCentredOf = (Bits & kQCentred) != 0;
// The bytes of a block's codes (where MatMulQ4K's / Q5K's sub-scales start), and of the whole block.
template <int Bits>
constexpr int64_t kQCodeBytesOf = kQCodeOf<Bits> == 4 || kQCodeOf<Bits> == kQ4NL ? kQ4BlockBytes
                                  : kQCodeOf<Bits> == 5                          ? kQ5BlockBytes
                                  : kQCodeOf<Bits> == kQ6K                       ? kQ6KBlockBytes
                                  : kQCodeOf<Bits> == kQ3K                       ? kQ3KBlockBytes
                                  : kQCodeOf<Bits> == kQ2K                       ? kQ2KBlockBytes
                                                                                 : kQ8BlockBytes;
template <int Bits>
constexpr int64_t kQBlockBytesOf = kQCodeBytesOf<Bits> + ((Bits & kQSuperScaled) ? kQXSSubBytes
                                                          : kQSuperBlockDMOf<Bits> ? kQKSubBytes
                                                                                   : 0);

// QuantizeRows: rows of x [T, K] to int8, per block of 32: xq = rint(x * 127 / amax) (amax = max |x| of
// the block, 0 -> codes 0), into xq [R, KB * 32] (zero-padded) and xs [R, KB, 2] = {dx, dx * sum(xq)}
// with dx = amax / 127. R = T rows, or with residual 2T: row 2t is x's, row 2t + 1 holds what row 2t
// misses, r = x - dx * xq (|r| <= dx / 2, rounded once), on a grid kResidualSteps times finer:
// xq' = rint(r * (kResidualSteps * 127 / amax)) clamped to +-127, dx' = dx / kResidualSteps. So
// x ~ dx' * (256 * xq + xq'), one 16-bit code per value, and a kernel may add a pair's integer dot
// products before it scales them: dx' * (256 * dot(q, xq) + dot(q, xq')). The two rows' 2 * KB * 32
// bytes are a build's own: the AVX2 build stores the 16-bit codes 256 * xq + xq' there instead, as int16
// (matmul_q_group_avx2.h), so a build's QTile reads only its own build's QuantizeRows.
// halves (MatMulQ2K's, else nullptr: not written): [R, KB, 2] as xs, each int8 row's dx * sum(xq) over the block's
// columns 0..15 and over 16..31 (its mins' terms), summed as the codes are formed.
// AdaptRows: QuantizeRows' `count` int8 codes at xq, in place, as this build's QTile reads them for `bits`
// (the AVX-512 build's MatMulQ3K and Q6K: as unsigned bytes x + 128; every other kernel: as they are).
// QTile: y[t, 16g + r] = sum_b xs[t,b,0] * d * dot(q, xq) + m * xs[t,b,1] (+ bias) for rows
// [t0, t1) of xq and groups [g0, g1); only columns < N are written. pairs: y[t / 2] gets the sum of
// rows t and t + 1 (t0, t1 even). bits: 4, 5, 8, kQ4NL (each of them | kQCentred too), kQ4K, kQ5K, kQ2K, kQ3K or
// kQ6K; half: scales are fp16 (else f32); halves: QuantizeRows' (MatMulQ2K's mins read them).
#define ORTSERVE_Q_KERNELS                                                                              \
  void QuantizeRows(const float* x, int64_t T, int64_t K, bool residual, int8_t* xq, float* xs,         \
                    float* halves);                                                                      \
  void AdaptRows(int bits, int8_t* xq, int64_t count);                                                  \
  void QTile(int bits, const uint8_t* codes, const void* scales, bool half, bool pairs, const int8_t* xq, \
             const float* xs, const float* halves, const float* bias, float* y, int64_t KB, int64_t N,    \
             int64_t t0, int64_t t1,                                                                     \
             int64_t g0, int64_t g1);

#ifndef ORTSERVE_GENERIC_KERNEL_ONLY
namespace avx512 { ORTSERVE_Q_KERNELS }
namespace avx2 { ORTSERVE_Q_KERNELS }
#endif
namespace generic { ORTSERVE_Q_KERNELS }

#undef ORTSERVE_Q_KERNELS

}  // namespace ortserve
