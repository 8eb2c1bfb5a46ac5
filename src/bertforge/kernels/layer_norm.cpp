// The residual add and LayerNorm of the fused pre-norm blocks under bf16 autocast, in one pass each.
//
// Under bf16 autocast a pre-norm block keeps its residual stream in float32, adds to it the bf16
// output of a matmul, normalises the sum and feeds the result to the next bf16 matmul. In torch
// ops that is a cast of the matmul's output to float32 (type promotion), the add, the LayerNorm in
// float32 and a cast to bf16: four passes over [N, H]. Here:
// - layer_norm_bf16(x): each row's mean and variance in float32, the normalised row rounded once
//   to bf16 as it is written;
// - add_bf16(stream, y): stream + y in float32 (y widened exactly), one pass;
// - add_layer_norm_bf16(stream, y): both, the sum written once in float32 and normalised while its
//   row is still in cache.
// The numbers are torch's ops' up to float32 rounding in the sums. Rows are independent tasks, so
// outputs are the same bit for bit at any thread count.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>

#include "simd.h"

namespace {

using namespace bertforge_simd;

void normalise_row(const float* x, const float* w, const float* b, int64_t H, double eps, c10::BFloat16* y) {
  const int64_t full = H / W * W;
  float mean, rstd;
  row_moments(x, H, static_cast<float>(eps), &mean, &rstd);
  for (int64_t c = 0; c < full; c += W) {
    vf t = (load(x + c) - mean) * rstd;
    if (w != nullptr) t *= load(w + c);
    if (b != nullptr) t += load(b + c);
    Io<c10::BFloat16>::store(y + c, t);
  }
  for (int64_t c = full; c < H; ++c) {
    float t = (x[c] - mean) * rstd;
    if (w != nullptr) t *= w[c];
    if (b != nullptr) t += b[c];
    y[c] = static_cast<c10::BFloat16>(t);
  }
}

// sum[n] = stream[n] + y[n] in float32, for one row of H.
void add_row(const float* stream, const c10::BFloat16* y, int64_t H, float* sum) {
  const int64_t full = H / W * W;
  for (int64_t c = 0; c < full; c += W) store(sum + c, load(stream + c) + Io<c10::BFloat16>::load(y + c));
  for (int64_t c = full; c < H; ++c) sum[c] = stream[c] + static_cast<float>(y[c]);
}

void check_rows(const at::Tensor& t, at::ScalarType dtype, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype && t.dim() == 2 && t.is_contiguous(), what);
}

struct Affine {
  at::Tensor w, b;
  const float* wd = nullptr;
  const float* bd = nullptr;
};

Affine affine(const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, int64_t H) {
  Affine a;
  for (const auto& [given, kept] : {std::pair{&weight, &a.w}, std::pair{&bias, &a.b}})
    if (given->has_value()) {
      *kept = (*given)->contiguous();
      TORCH_CHECK(kept->scalar_type() == at::kFloat && kept->dim() == 1 && kept->size(0) == H,
                  "layer_norm_bf16: weight and bias must be float32 [H]");
    }
  a.wd = a.w.defined() ? a.w.data_ptr<float>() : nullptr;
  a.bd = a.b.defined() ? a.b.data_ptr<float>() : nullptr;
  return a;
}

constexpr int64_t kGrain = 16;  // rows per task: enough to amortise a task, few enough to spread

at::Tensor layer_norm_bf16(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, double eps) {
  check_rows(x, at::kFloat, "layer_norm_bf16: x must be a contiguous float32 CPU matrix [N, H]");
  const int64_t N = x.size(0), H = x.size(1);
  const Affine a = affine(weight, bias, H);
  at::Tensor y = at::empty({N, H}, x.options().dtype(at::kBFloat16));
  const float* xd = x.data_ptr<float>();
  c10::BFloat16* yd = y.data_ptr<c10::BFloat16>();
  at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) normalise_row(xd + n * H, a.wd, a.bd, H, eps, yd + n * H);
  });
  return y;
}

// The two-operand checks of add_bf16 and add_layer_norm_bf16.
void check_pair(const at::Tensor& stream, const at::Tensor& y) {
  check_rows(stream, at::kFloat, "add_bf16: stream must be a contiguous float32 CPU matrix [N, H]");
  check_rows(y, at::kBFloat16, "add_bf16: y must be a contiguous bfloat16 CPU matrix [N, H]");
  TORCH_CHECK(stream.sizes() == y.sizes(), "add_bf16: stream and y must have one shape");
}

at::Tensor add_bf16(const at::Tensor& stream, const at::Tensor& y) {
  check_pair(stream, y);
  const int64_t N = stream.size(0), H = stream.size(1);
  at::Tensor sum = at::empty_like(stream);
  const float* sd = stream.data_ptr<float>();
  const c10::BFloat16* yd = y.data_ptr<c10::BFloat16>();
  float* out = sum.data_ptr<float>();
  at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) add_row(sd + n * H, yd + n * H, H, out + n * H);
  });
  return sum;
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_bf16(const at::Tensor& stream, const at::Tensor& y,
                                                       const std::optional<at::Tensor>& weight,
                                                       const std::optional<at::Tensor>& bias, double eps) {
  check_pair(stream, y);
  const int64_t N = stream.size(0), H = stream.size(1);
  const Affine a = affine(weight, bias, H);
  at::Tensor sum = at::empty_like(stream);
  at::Tensor normed = at::empty({N, H}, stream.options().dtype(at::kBFloat16));
  const float* sd = stream.data_ptr<float>();
  const c10::BFloat16* yd = y.data_ptr<c10::BFloat16>();
  float* out = sum.data_ptr<float>();
  c10::BFloat16* nd = normed.data_ptr<c10::BFloat16>();
  at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      add_row(sd + n * H, yd + n * H, H, out + n * H);
      normalise_row(out + n * H, a.wd, a.bd, H, eps, nd + n * H);
    }
  });
  return {sum, normed};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bertforge, m) {
  m.def("layer_norm_bf16(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor");
  m.def("add_bf16(Tensor stream, Tensor y) -> Tensor");
  m.def("add_layer_norm_bf16(Tensor stream, Tensor y, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bertforge, CPU, m) {
  m.impl("layer_norm_bf16", layer_norm_bf16);
  m.impl("add_bf16", add_bf16);
  m.impl("add_layer_norm_bf16", add_layer_norm_bf16);
}
