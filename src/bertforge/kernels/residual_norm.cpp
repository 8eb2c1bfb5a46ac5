// The post-LN block's residual add and LayerNorm for training, forward and backward, one pass each.
//
// BERT's blocks end in x = LayerNorm(x + y): x the float32 residual stream, y the (dropped-out)
// output of the attention or the feed-forward, float32 or, under bf16 autocast, bfloat16. In torch
// ops that is, forward, a cast of y to float32 (type promotion), the add, and the LayerNorm; and
// backward, the LayerNorm's gradient, then a cast of it for y. Here:
//   forward:  s = x + y (float32, y widened exactly); out = (s - mean) * rstd * w + b, per row;
//             s, mean and rstd are kept for the backward pass;
//   backward: with xh = (s - mean) * rstd and gw = g * w, per row
//             ds = rstd * (gw - mean(gw) - xh * mean(gw * xh)),
//             written as float32 (x's gradient) and, when y is bfloat16, rounded once for y;
//             dw = sum over rows of g * xh, db = sum over rows of g.
// dw and db are summed in fixed blocks of rows, then over the blocks in order, so every output is
// the same bit for bit at any thread count.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "simd.h"

namespace {

using namespace bertforge_simd;

constexpr int64_t kGrain = 16;   // rows per task
constexpr int64_t kBlock = 64;   // rows per partial sum of dw and db

template <typename T>
void forward_row(const float* x, const T* y, const float* w, const float* b, int64_t H, float eps, float* s,
                 float* out, float* mean_out, float* rstd_out) {
  const int64_t full = H / W * W;
  for (int64_t c = 0; c < full; c += W) store(s + c, load(x + c) + Io<T>::load(y + c));
  for (int64_t c = full; c < H; ++c) s[c] = x[c] + static_cast<float>(y[c]);
  float mean, rstd;
  row_moments(s, H, eps, &mean, &rstd);  // the row is still in cache
  for (int64_t c = 0; c < full; c += W) store(out + c, (load(s + c) - mean) * rstd * load(w + c) + load(b + c));
  for (int64_t c = full; c < H; ++c) out[c] = (s[c] - mean) * rstd * w[c] + b[c];
  *mean_out = mean;
  *rstd_out = rstd;
}

void check(const at::Tensor& t, at::ScalarType dtype, int64_t dims, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype && t.dim() == dims && t.is_contiguous(), what);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> residual_layer_norm(
    const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  check(x, at::kFloat, 2, "residual_layer_norm: x must be a contiguous float32 CPU matrix [N, H]");
  TORCH_CHECK(y.sizes() == x.sizes() && y.is_contiguous() && y.device().is_cpu() &&
                  (y.scalar_type() == at::kFloat || y.scalar_type() == at::kBFloat16),
              "residual_layer_norm: y must be a contiguous float32 or bfloat16 CPU matrix shaped as x");
  const int64_t N = x.size(0), H = x.size(1);
  check(weight, at::kFloat, 1, "residual_layer_norm: weight must be float32 [H]");
  check(bias, at::kFloat, 1, "residual_layer_norm: bias must be float32 [H]");
  TORCH_CHECK(weight.size(0) == H && bias.size(0) == H, "residual_layer_norm: weight and bias must be [H]");
  at::Tensor out = at::empty_like(x), s = at::empty_like(x);
  at::Tensor mean = at::empty({N}, x.options()), rstd = at::empty({N}, x.options());
  const float *xd = x.data_ptr<float>(), *wd = weight.data_ptr<float>(), *bd = bias.data_ptr<float>();
  float *od = out.data_ptr<float>(), *sd = s.data_ptr<float>(), *md = mean.data_ptr<float>(), *rd = rstd.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      if (y.scalar_type() == at::kFloat)
        forward_row(xd + n * H, y.data_ptr<float>() + n * H, wd, bd, H, e, sd + n * H, od + n * H, md + n, rd + n);
      else
        forward_row(xd + n * H, y.data_ptr<c10::BFloat16>() + n * H, wd, bd, H, e, sd + n * H, od + n * H, md + n, rd + n);
    }
  });
  return {out, s, mean, rstd};
}

// One row's ds (float32, and rounded for y when dy is given), and its terms added into dw and db.
void backward_row(const float* g, const float* s, float mean, float rstd, const float* w, int64_t H, float* ds,
                  c10::BFloat16* dy, float* dw, float* db) {
  const int64_t full = H / W * W;
  vf a1 = {}, a2 = {};
  for (int64_t c = 0; c < full; c += W) {
    const vf xh = (load(s + c) - mean) * rstd, gc = load(g + c), gw = gc * load(w + c);
    a1 += gw;
    a2 += gw * xh;
    store(dw + c, load(dw + c) + gc * xh);
    store(db + c, load(db + c) + gc);
  }
  float m1 = hsum(a1), m2 = hsum(a2);
  for (int64_t c = full; c < H; ++c) {
    const float xh = (s[c] - mean) * rstd, gw = g[c] * w[c];
    m1 += gw;
    m2 += gw * xh;
    dw[c] += g[c] * xh;
    db[c] += g[c];
  }
  m1 /= static_cast<float>(H);
  m2 /= static_cast<float>(H);
  for (int64_t c = 0; c < full; c += W) {
    const vf xh = (load(s + c) - mean) * rstd;
    const vf d = (load(g + c) * load(w + c) - m1 - xh * m2) * rstd;
    store(ds + c, d);
    if (dy != nullptr) Io<c10::BFloat16>::store(dy + c, d);
  }
  for (int64_t c = full; c < H; ++c) {
    const float xh = (s[c] - mean) * rstd;
    ds[c] = (g[c] * w[c] - m1 - xh * m2) * rstd;
    if (dy != nullptr) dy[c] = static_cast<c10::BFloat16>(ds[c]);
  }
}

// (dx float32 [N, H], dy bfloat16 [N, H] or an empty tensor when y was float32, dw [H], db [H]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> residual_layer_norm_backward(
    const at::Tensor& grad, const at::Tensor& s, const at::Tensor& mean, const at::Tensor& rstd,
    const at::Tensor& weight, bool y_bf16) {
  check(grad, at::kFloat, 2, "residual_layer_norm_backward: grad must be a contiguous float32 CPU matrix [N, H]");
  check(s, at::kFloat, 2, "residual_layer_norm_backward: s must be a contiguous float32 CPU matrix [N, H]");
  TORCH_CHECK(grad.sizes() == s.sizes(), "residual_layer_norm_backward: grad and s must have one shape");
  const int64_t N = s.size(0), H = s.size(1);
  check(mean, at::kFloat, 1, "residual_layer_norm_backward: mean must be float32 [N]");
  check(rstd, at::kFloat, 1, "residual_layer_norm_backward: rstd must be float32 [N]");
  check(weight, at::kFloat, 1, "residual_layer_norm_backward: weight must be float32 [H]");
  TORCH_CHECK(mean.size(0) == N && rstd.size(0) == N && weight.size(0) == H,
              "residual_layer_norm_backward: mean, rstd [N] and weight [H] must match s");
  at::Tensor dx = at::empty_like(s);
  at::Tensor dy = y_bf16 ? at::empty({N, H}, s.options().dtype(at::kBFloat16)) : at::empty({0}, s.options());
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  at::Tensor partial = at::zeros({blocks, 2, H}, s.options());  // per block: dw's and db's sums
  const float *gd = grad.data_ptr<float>(), *sd = s.data_ptr<float>(), *md = mean.data_ptr<float>();
  const float *rd = rstd.data_ptr<float>(), *wd = weight.data_ptr<float>();
  float *dxd = dx.data_ptr<float>(), *pd = partial.data_ptr<float>();
  c10::BFloat16* dyd = y_bf16 ? dy.data_ptr<c10::BFloat16>() : nullptr;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k)
      for (int64_t n = k * kBlock; n < std::min(N, (k + 1) * kBlock); ++n)
        backward_row(gd + n * H, sd + n * H, md[n], rd[n], wd, H, dxd + n * H,
                     dyd != nullptr ? dyd + n * H : nullptr, pd + k * 2 * H, pd + k * 2 * H + H);
  });
  at::Tensor dw = at::zeros({H}, s.options()), db = at::zeros({H}, s.options());
  float *dwd = dw.data_ptr<float>(), *dbd = db.data_ptr<float>();
  at::parallel_for(0, H, 256, [&](int64_t c0, int64_t c1) {  // columns apart; blocks in order within each
    for (int64_t k = 0; k < blocks; ++k)
      for (int64_t c = c0; c < c1; ++c) {
        dwd[c] += pd[k * 2 * H + c];
        dbd[c] += pd[k * 2 * H + H + c];
      }
  });
  return {dx, dy, dw, db};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bertforge, m) {
  m.def("residual_layer_norm(Tensor x, Tensor y, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("residual_layer_norm_backward(Tensor grad, Tensor s, Tensor mean, Tensor rstd, Tensor weight, bool y_bf16)"
        " -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bertforge, CPU, m) {
  m.impl("residual_layer_norm", residual_layer_norm);
  m.impl("residual_layer_norm_backward", residual_layer_norm_backward);
}
