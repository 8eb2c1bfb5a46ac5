// bfloat16 dot products for the attention kernels, on CPUs that have them (AVX512-BF16: Intel
// Cooper Lake, Sapphire Rapids and later, AMD Zen 4 and later).
//
// One `vdpbf16ps` multiplies 16 pairs of bfloat16 by 16 pairs and adds each lane's two products
// to a float32 accumulator: 64 flops, where a float32 FMA does 32 in the same slot. So the
// products of attention run twice as fast on bf16 inputs, with float32 sums. Each operand is a
// `word`, two bfloat16 side by side (the first in the low half), and both operands of a product
// must pair the same two terms of the sum: the packers below lay the tensors out that way.
//
// Which products, for attention's [L, d] q, k, v and [L, L] probabilities (L padded to Lp):
//   dots_by_columns: out[i, j] = a_i . b_j        (q k^T, dout v^T), b packed by pack_columns;
//   dots_by_rows:    out_r = sum_j m(r, j) b_j    (P v, dS k; and P^T dout, dS^T q with m's
//                    columns as rows), m rounded to bf16 by round_rows or interleave_rows and b
//                    packed by pack_row_pairs.
// Everything that needs the instructions is compiled for them alone (a target attribute), so one
// build serves every x86 CPU and `bf16_dots_supported()` picks at run time.

#pragma once

#include "simd.h"

#include <algorithm>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BERTFORGE_BF16_DOTS 1
#define BF16_DOTS_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#endif

namespace bertforge_simd {

using word = uint32_t;  // two bfloat16: the first in the low half, the second in the high

// Whether this CPU has the instructions (asked once).
inline bool bf16_dots_supported() {
#ifdef BERTFORGE_BF16_DOTS
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
#else
  return false;
#endif
}

// Rows [base, base + L), head h's d = C * W columns of x [N, H], as pairs of columns:
// out[p * Lp + j] = (x_j[2p], x_j[2p + 1]) for j < L, zero for L <= j < Lp. [d / 2, Lp] words.
template <int C>
void pack_columns(const c10::BFloat16* x, int64_t base, int64_t L, int64_t Lp, int64_t h, int64_t H, word* out) {
  constexpr int d = C * W;
  for (int p = 0; p < d / 2; ++p) std::fill(out + p * Lp + L, out + (p + 1) * Lp, word{0});
  for (int64_t j = 0; j < L; ++j) {
    const c10::BFloat16* row = x + (base + j) * H + h * d;
    for (int p = 0; p < d / 2; ++p) std::memcpy(out + p * Lp + j, row + 2 * p, sizeof(word));
  }
}

// The same rows as pairs of rows: out[jp * d + c] = (x_{2 jp}[c], x_{2 jp + 1}[c]) for
// jp < (L + 1) / 2, the missing row of an odd L zero. [(L + 1) / 2, d] words.
template <int C>
void pack_row_pairs(const c10::BFloat16* x, int64_t base, int64_t L, int64_t h, int64_t H, word* out) {
  constexpr int d = C * W;
  for (int64_t jp = 0; jp < (L + 1) / 2; ++jp) {
    const c10::BFloat16* r0 = x + (base + 2 * jp) * H + h * d;
    const c10::BFloat16* r1 = 2 * jp + 1 < L ? r0 + H : nullptr;
    for (int c = 0; c < d; ++c) out[jp * d + c] = word{r0[c].x} | (r1 ? word{r1[c].x} << 16 : word{0});
  }
}

// float m [L, Lp] rounded to bfloat16 rows: row i's pair jp is out[i * Lp / 2 + jp]. Lp % W == 0.
inline void round_rows(const float* m, int64_t L, int64_t Lp, word* out) {
  for (int64_t i = 0; i < L; ++i)
    for (int64_t b = 0; b < Lp; b += W) Io<c10::BFloat16>::store(reinterpret_cast<c10::BFloat16*>(out) + i * Lp + b,
                                                                 load(m + i * Lp + b));
}

// float m [L, Lp] rounded to bfloat16 and paired down its columns: out[ip * Lp + j] =
// (m[2 ip][j], m[2 ip + 1][j]) for ip < (L + 1) / 2, the missing row of an odd L zero.
inline void interleave_rows(const float* m, int64_t L, int64_t Lp, word* out) {
  for (int64_t ip = 0; ip < (L + 1) / 2; ++ip) {
    const float* r0 = m + 2 * ip * Lp;
    const bool second = 2 * ip + 1 < L;
    for (int64_t b = 0; b < Lp; b += W) {
      const vu lo = bf16_bits(load(r0 + b));
      const vu hi = second ? bf16_bits(load(r0 + Lp + b)) : vu{};
      const vu pair = lo | (hi << 16);
      std::memcpy(out + ip * Lp + b, &pair, sizeof(pair));
    }
  }
}

#ifdef BERTFORGE_BF16_DOTS

BF16_DOTS_TARGET inline __m512 dot(__m512 acc, __m512i a, __m512i b) {
  __m512bh x, y;
  std::memcpy(&x, &a, sizeof(x));
  std::memcpy(&y, &b, sizeof(y));
  return _mm512_dpbf16_ps(acc, x, y);
}

constexpr int DOT_ROWS = 4;  // rows computed together: independent chains keep the units busy

// out[i, j] = scale * (a_i . b_j) for i < L, j < Lp, with a_i the d = C * W bfloat16 at
// a + i * lda and b packed by pack_columns. out is [L, Lp] float.
template <int C>
BF16_DOTS_TARGET void dots_by_columns(const c10::BFloat16* a, int64_t lda, int64_t L, const word* bP, int64_t Lp,
                                      float scale, float* out) {
  constexpr int pairs = C * W / 2;
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t i0 = 0; i0 < L; i0 += DOT_ROWS) {
    const int rows = static_cast<int>(std::min<int64_t>(DOT_ROWS, L - i0));
    const c10::BFloat16* ar[DOT_ROWS];  // a short last group repeats its last row and stores only `rows`
    for (int r = 0; r < DOT_ROWS; ++r) ar[r] = a + std::min<int64_t>(i0 + r, L - 1) * lda;
    int64_t b = 0;
    for (; b + 2 * W <= Lp; b += 2 * W) {
      __m512 acc[DOT_ROWS][2];
      for (int r = 0; r < DOT_ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      for (int p = 0; p < pairs; ++p) {
        const __m512i lo = _mm512_loadu_si512(bP + p * Lp + b), hi = _mm512_loadu_si512(bP + p * Lp + b + W);
        for (int r = 0; r < DOT_ROWS; ++r) {
          word w;
          std::memcpy(&w, ar[r] + 2 * p, sizeof(w));
          const __m512i x = _mm512_set1_epi32(static_cast<int>(w));
          acc[r][0] = dot(acc[r][0], x, lo);
          acc[r][1] = dot(acc[r][1], x, hi);
        }
      }
      for (int r = 0; r < rows; ++r) {
        _mm512_storeu_ps(out + (i0 + r) * Lp + b, _mm512_mul_ps(acc[r][0], s));
        _mm512_storeu_ps(out + (i0 + r) * Lp + b + W, _mm512_mul_ps(acc[r][1], s));
      }
    }
    for (; b < Lp; b += W) {
      __m512 acc[DOT_ROWS];
      for (int r = 0; r < DOT_ROWS; ++r) acc[r] = _mm512_setzero_ps();
      for (int p = 0; p < pairs; ++p) {
        const __m512i col = _mm512_loadu_si512(bP + p * Lp + b);
        for (int r = 0; r < DOT_ROWS; ++r) {
          word w;
          std::memcpy(&w, ar[r] + 2 * p, sizeof(w));
          acc[r] = dot(acc[r], _mm512_set1_epi32(static_cast<int>(w)), col);
        }
      }
      for (int r = 0; r < rows; ++r) _mm512_storeu_ps(out + (i0 + r) * Lp + b, _mm512_mul_ps(acc[r], s));
    }
  }
}

// out_r = sum_{jp < pairs} m(r, jp) . bR[jp] for r < R: m(r, jp) = m[r * rs + jp * ps] (a pair of
// weights), bR packed by pack_row_pairs ([pairs, d] words), out [R, d] float.
template <int C>
BF16_DOTS_TARGET void dots_by_rows(const word* m, int64_t rs, int64_t ps, int64_t R, int64_t pairs, const word* bR,
                                   float* out) {
  constexpr int d = C * W;
  constexpr int RR = C >= 8 ? 2 : DOT_ROWS;  // RR * C accumulators and C operands fit the 32 registers
  for (int64_t r0 = 0; r0 < R; r0 += RR) {
    const int rows = static_cast<int>(std::min<int64_t>(RR, R - r0));
    const word* mr[RR];
    for (int r = 0; r < RR; ++r) mr[r] = m + std::min<int64_t>(r0 + r, R - 1) * rs;
    __m512 acc[RR][C];
    for (int r = 0; r < RR; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t jp = 0; jp < pairs; ++jp) {
      __m512i bj[C];
      for (int c = 0; c < C; ++c) bj[c] = _mm512_loadu_si512(bR + jp * d + c * W);
      for (int r = 0; r < RR; ++r) {
        const __m512i w = _mm512_set1_epi32(static_cast<int>(mr[r][jp * ps]));
        for (int c = 0; c < C; ++c) acc[r][c] = dot(acc[r][c], w, bj[c]);
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + (r0 + r) * d + c * W, acc[r][c]);
  }
}

#endif  // BERTFORGE_BF16_DOTS

}  // namespace bertforge_simd
