// The pieces both inference attention kernels (varlen_attention.cpp, disentangled_attention.cpp)
// are built from: QB query rows handled together, their scores against blocks of W keys, the
// softmax of those rows, and p v; and the rotary turn of one row (varlen_attention.cpp, rotary.cpp). Why QB rows together: their dependency chains are independent,
// so the FMA units are kept busy instead of waiting on one chain.

#pragma once

#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace bertforge_attention {

using namespace bertforge_simd;

constexpr int QB = 4;  // rows computed together

// out[r][b*W .. b*W + W) = sum_c a[r][c] * bT[c][b*W ..] for the QB rows a[r] (float [d] each) and
// the column blocks b in [b0, b1) of bT (float [d, ld], columns transposed into rows). D > 0 is the
// head size known at compile time, so the loop over it unrolls. out has row stride out_ld.
template <int D>
inline void block_products(const float* const a[QB], const float* bT, int64_t ld, int64_t b0, int64_t b1,
                           int64_t d, float* out, int64_t out_ld) {
  const int64_t depth = D > 0 ? D : d;
  for (int64_t b = b0; b < b1; ++b) {
    vf acc[QB] = {};
    for (int64_t c = 0; c < depth; ++c) {
      const vf x = load(bT + c * ld + b * W);
      for (int r = 0; r < QB; ++r) acc[r] += a[r][c] * x;
    }
    for (int r = 0; r < QB; ++r) store(out + r * out_ld + b * W, acc[r]);
  }
}

// Softmax of QB rows of scores p (row stride ld), over their first nb blocks of W, in place;
// masked lanes hold -inf, which exp_nonpositive takes to 0. The rows are left unnormalised:
// inv[r] receives 1 / row r's sum, applied once to p v instead of to every probability. The max
// is subtracted first, so the softmax is exact up to rounding.
inline void softmax_rows(float* p, int64_t ld, int64_t nb, float inv[QB]) {
  vf m[QB], sum[QB] = {};
  for (int r = 0; r < QB; ++r) m[r] = load(p + r * ld);
  for (int64_t b = 1; b < nb; ++b)
    for (int r = 0; r < QB; ++r) {
      const vf x = load(p + r * ld + b * W);
      m[r] = x > m[r] ? x : m[r];
    }
  for (int r = 0; r < QB; ++r) m[r] = splat(hmax(m[r]));
  for (int64_t b = 0; b < nb; ++b)
    for (int r = 0; r < QB; ++r) {
      const vf e = exp_nonpositive(load(p + r * ld + b * W) - m[r]);
      store(p + r * ld + b * W, e);
      sum[r] += e;
    }
  for (int r = 0; r < QB; ++r) inv[r] = 1.0f / hsum(sum[r]);
}

// p v for QB rows of probabilities, each scaled by its 1 / sum at the end, written as T (float or
// bfloat16, rounded once). v0: L value rows of d floats, `row` apart. D > 0 is the head size known
// at compile time (its accumulators stay in registers); D == 0 is any other size.
template <int D, typename T>
void weighted_values(const float* v0, int64_t row, int64_t L, const float* p, int64_t Lp, const float* inv,
                     int rows, int64_t d, T* out, int64_t H) {
  if constexpr (D > 0) {
    vf acc[QB][D / W] = {};
    for (int64_t j = 0; j < L; ++j) {
      vf v[D / W];
      for (int c = 0; c < D / W; ++c) v[c] = load(v0 + j * row + c * W);
      for (int r = 0; r < QB; ++r) {
        const float prj = p[r * Lp + j];
        for (int c = 0; c < D / W; ++c) acc[r][c] += prj * v[c];
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < D / W; ++c) Io<T>::store(out + r * H + c * W, acc[r][c] * inv[r]);
  } else {
    for (int r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) {
        float o = 0.0f;
        for (int64_t j = 0; j < L; ++j) o += p[r * Lp + j] * v0[j * row + c];
        out[r * H + c] = static_cast<T>(o * inv[r]);
      }
  }
}

// One query or key row x [d] (float or bfloat16), turned by its token's angles into float32 y:
// pair (c, c + d/2) is rotated as transformers' x * cos + rotate_half(x) * sin does it, in float32.
template <typename T>
inline void rotate_row(const T* x, const float* cs, const float* sn, int64_t d, float* y) {
  const int64_t half = d / 2;
  for (int64_t c = 0; c < half; ++c) {
    const float a = static_cast<float>(x[c]), b = static_cast<float>(x[c + half]);
    y[c] = a * cs[c] - b * sn[c];
    y[c + half] = b * cs[c + half] + a * sn[c + half];
  }
}

}  // namespace bertforge_attention
