// bfloat16 matrix products on Intel AMX tiles (Sapphire Rapids and later), for the attention
// kernels' small per-head products.
//
// On this project's AMX host a float32 FMA loop reaches ~170 GFLOP/s per core and AVX512-BF16's
// vdpbf16ps half that (docs/results.md), while one tile product (TDPBF16PS: a 16 x 32 bf16 tile
// times a 32 x 16 one into a 16 x 16 float32 tile) does 16,384 flops. Each product here:
//   amx_gemm: C [M, N] float32 = A [M, K] bf16 (rows) x B [K, N] bf16, with B in the tiles' pair
//   layout ("VNNI"): word (p, n) holds B[2p, n] in its low half and B[2p + 1, n] in its high half.
// M and N must be multiples of 16 and K of 32; the packers below pad with zeros to get there.
// The sums are float32 (the products of two bf16 are exact in float32; the tile unit rounds each
// addition to nearest even and treats denormal inputs and results as zero).
//
// Everything that runs tile instructions is compiled for them alone (a target attribute), so one
// build serves every x86 CPU; `amx_supported()` checks the CPU and asks Linux for the tile state
// (a process must, once, before its first tile instruction).

#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "simd.h"

// The tile intrinsics and target names need GCC 11 or Clang 12; an older compiler builds the
// kernels without this path rather than failing to build them at all.
#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define BERTFORGE_AMX 1
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")))
#endif

namespace bertforge_amx {

using bertforge_simd::vf;
using bertforge_simd::vu;
using bertforge_simd::W;
using BF16 = c10::BFloat16;
using word = uint32_t;  // two bf16: the first in the low half

// Whether this process can run AMX bf16 tile products (asked once).
inline bool amx_supported() {
#ifdef BERTFORGE_AMX
  static const bool yes = [] {
    unsigned eax, ebx, ecx, edx;  // CPUID leaf 7: AMX-BF16 is EDX bit 22, AMX-TILE bit 24
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 22)) || !(edx & (1u << 24))) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;  // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return yes;
#else
  return false;
#endif
}

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Rows [base, base + L) of head h (d columns) of x [N, H], copied to out [rows, d], rows past L zero.
inline void copy_rows(const BF16* x, int64_t base, int64_t L, int64_t h, int64_t H, int64_t d, int64_t rows,
                      BF16* out) {
  for (int64_t i = 0; i < L; ++i) std::memcpy(out + i * d, x + (base + i) * H + h * d, d * sizeof(BF16));
  std::memset(static_cast<void*>(out + L * d), 0, (rows - L) * d * sizeof(BF16));
}

// The same rows transposed: out [d, cols] with out[c, i] = x_i[c], columns past L zero.
inline void copy_transposed(const BF16* x, int64_t base, int64_t L, int64_t h, int64_t H, int64_t d, int64_t cols,
                            BF16* out) {
  for (int64_t c = 0; c < d; ++c) std::memset(static_cast<void*>(out + c * cols + L), 0, (cols - L) * sizeof(BF16));
  for (int64_t i = 0; i < L; ++i) {
    const BF16* row = x + (base + i) * H + h * d;
    for (int64_t c = 0; c < d; ++c) out[c * cols + i] = row[c];
  }
}

// The rows as B = x^T [d, n] in pair layout: out[p, j] = (x_j[2p], x_j[2p + 1]) for j < L, zero
// for L <= j < n. [d / 2, n] words.
inline void pair_columns(const BF16* x, int64_t base, int64_t L, int64_t h, int64_t H, int64_t d, int64_t n,
                         word* out) {
  for (int64_t p = 0; p < d / 2; ++p) std::fill(out + p * n + L, out + (p + 1) * n, word{0});
  for (int64_t j = 0; j < L; ++j) {
    const BF16* row = x + (base + j) * H + h * d;
    for (int64_t p = 0; p < d / 2; ++p) std::memcpy(out + p * n + j, row + 2 * p, sizeof(word));
  }
}

// The rows as B = x [k, d] in pair layout: out[p, c] = (x_{2p}[c], x_{2p + 1}[c]), rows past L
// zero. [k / 2, d] words; d % W == 0.
inline void pair_rows(const BF16* x, int64_t base, int64_t L, int64_t h, int64_t H, int64_t d, int64_t k,
                      word* out) {
  using bertforge_simd::vh;
  for (int64_t p = 0; p < k / 2; ++p) {
    const int64_t i0 = 2 * p, i1 = 2 * p + 1;
    const BF16* r0 = i0 < L ? x + (base + i0) * H + h * d : nullptr;
    const BF16* r1 = i1 < L ? x + (base + i1) * H + h * d : nullptr;
    for (int64_t c = 0; c < d; c += W) {  // d % W == 0
      vh lo = {}, hi = {};
      if (r0) std::memcpy(&lo, r0 + c, sizeof(lo));
      if (r1) std::memcpy(&hi, r1 + c, sizeof(hi));
      const vu pair = __builtin_convertvector(lo, vu) | (__builtin_convertvector(hi, vu) << 16);
      std::memcpy(out + p * d + c, &pair, sizeof(pair));
    }
  }
}

// float m [L, n] (n % W == 0) rounded to bf16 rows of out [rows, cols] (cols >= n), zero past
// column n and below row L: an A operand.
inline void round_rows(const float* m, int64_t L, int64_t n, int64_t rows, int64_t cols, BF16* out) {
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t b = 0; b < n; b += W) bertforge_simd::Io<BF16>::store(out + i * cols + b, bertforge_simd::load(m + i * n + b));
    std::memset(static_cast<void*>(out + i * cols + n), 0, (cols - n) * sizeof(BF16));
  }
  std::memset(static_cast<void*>(out + L * cols), 0, (rows - L) * cols * sizeof(BF16));
}

// float m [L, n] (n % W == 0) rounded to bf16 as a B operand [k, n] in pair layout: out[p, j] =
// (m[2p, j], m[2p + 1, j]), rows past L zero. [k / 2, n] words.
inline void round_pair_rows(const float* m, int64_t L, int64_t n, int64_t k, word* out) {
  for (int64_t p = 0; p < k / 2; ++p) {
    const int64_t i0 = 2 * p, i1 = 2 * p + 1;
    for (int64_t b = 0; b < n; b += W) {
      const vu lo = i0 < L ? bertforge_simd::bf16_bits(bertforge_simd::load(m + i0 * n + b)) : vu{};
      const vu hi = i1 < L ? bertforge_simd::bf16_bits(bertforge_simd::load(m + i1 * n + b)) : vu{};
      const vu pair = lo | (hi << 16);
      std::memcpy(out + p * n + b, &pair, sizeof(pair));
    }
  }
}

#ifdef BERTFORGE_AMX

// The tile shapes every product here uses, all 16 rows of 64 bytes: tiles 0-3 float32
// accumulators (16 x 16), 4-5 A blocks (16 rows x 32 bf16), 6-7 B blocks (16 pairs x 16 columns).
// 64-byte LDTILECFG layout.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Load the shapes on this thread (before its first product) and release the tiles (after its
// last). Written as asm: GCC 12's builtin does not tell the compiler it reads the config, which
// then drops the stores that fill it.
AMX_TARGET inline void amx_begin() {
  static const TileConfig config;
  asm volatile("ldtilecfg %0" ::"m"(config));
}

AMX_TARGET inline void amx_end() { _tile_release(); }

// One RM x RN block of 16 x 16 output tiles (RM, RN 1 or 2): two A and two B tiles feed four
// products, so each tile loaded serves two. Every output tile sums over K in the same order
// whatever the blocking, so the bits do not depend on it.
template <int RM, int RN>
AMX_TARGET inline void amx_block(const BF16* A, int64_t lda, const word* B, int64_t ldb, float* C, int64_t ldc,
                                 int64_t K) {
  _tile_zero(0);
  if constexpr (RN == 2) _tile_zero(1);
  if constexpr (RM == 2) _tile_zero(2);
  if constexpr (RM == 2 && RN == 2) _tile_zero(3);
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    _tile_loadd(4, A + k0, lda * sizeof(BF16));
    if constexpr (RM == 2) _tile_loadd(5, A + 16 * lda + k0, lda * sizeof(BF16));
    _tile_loadd(6, B + (k0 / 2) * ldb, ldb * sizeof(word));
    if constexpr (RN == 2) _tile_loadd(7, B + (k0 / 2) * ldb + 16, ldb * sizeof(word));
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (RN == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (RM == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (RM == 2 && RN == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, C, ldc * sizeof(float));
  if constexpr (RN == 2) _tile_stored(1, C + 16, ldc * sizeof(float));
  if constexpr (RM == 2) _tile_stored(2, C + 16 * ldc, ldc * sizeof(float));
  if constexpr (RM == 2 && RN == 2) _tile_stored(3, C + 16 * ldc + 16, ldc * sizeof(float));
}

template <int RM>
AMX_TARGET inline void amx_row_of_blocks(const BF16* A, int64_t lda, const word* B, int64_t ldb, float* C,
                                         int64_t ldc, int64_t N, int64_t K) {
  int64_t n0 = 0;
  for (; n0 + 32 <= N; n0 += 32) amx_block<RM, 2>(A, lda, B + n0, ldb, C + n0, ldc, K);
  if (n0 < N) amx_block<RM, 1>(A, lda, B + n0, ldb, C + n0, ldc, K);
}

// C [M, N] (row stride ldc floats) = A [M, K] (bf16 rows, stride lda) x B (pair layout, [K / 2]
// rows of ldb words). M % 16 == 0, N % 16 == 0, K % 32 == 0; amx_begin() must have run.
AMX_TARGET inline void amx_gemm(const BF16* A, int64_t lda, const word* B, int64_t ldb, float* C, int64_t ldc,
                                int64_t M, int64_t N, int64_t K) {
  int64_t m0 = 0;
  for (; m0 + 32 <= M; m0 += 32) amx_row_of_blocks<2>(A + m0 * lda, lda, B, ldb, C + m0 * ldc, ldc, N, K);
  if (m0 < M) amx_row_of_blocks<1>(A + m0 * lda, lda, B, ldb, C + m0 * ldc, ldc, N, K);
}

#endif  // BERTFORGE_AMX

}  // namespace bertforge_amx
