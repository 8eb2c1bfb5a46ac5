// Rotary positions applied to the queries and keys of a fused QKV matrix, for ModernBERT's global
// layers where they go to SDPA (the native attention kernel rotates as it reads instead).
//
// transformers' rotation, x * cos + rotate_half(x) * sin in float32, is five passes in torch ops
// (widen, negate and concatenate the halves, two products and a sum, narrow) for each of q and k.
// Here each token's q and k rows are read once, turned in float32 by `rotate_row` (the same pair
// arithmetic as the attention kernel's) and rounded once to qkv's dtype. Rows are independent
// tasks, so outputs are the same bit for bit at any thread count.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "attention_blocks.h"

namespace {

using namespace bertforge_attention;

template <typename T>
void rotate_rows(const T* qkv, const float* cos, const float* sin, int64_t N, int64_t H, int64_t heads, T* out) {
  const int64_t d = H / heads;
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> turned(d);
    for (int64_t n = begin; n < end; ++n)
      for (int64_t part = 0; part < 2; ++part)  // q, then k
        for (int64_t h = 0; h < heads; ++h) {
          rotate_row(qkv + n * 3 * H + part * H + h * d, cos + n * d, sin + n * d, d, turned.data());
          T* dst = out + part * N * H + n * H + h * d;
          for (int64_t c = 0; c < d; ++c) dst[c] = static_cast<T>(turned[c]);
        }
  });
}

at::Tensor rotary(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t num_heads) {
  TORCH_CHECK(qkv.device().is_cpu() && (qkv.scalar_type() == at::kFloat || qkv.scalar_type() == at::kBFloat16) &&
                  qkv.dim() == 2 && qkv.is_contiguous() && num_heads > 0 && qkv.size(1) % (3 * num_heads) == 0,
              "rotary: qkv must be a contiguous float32 or bfloat16 CPU matrix [N, 3H], H split into heads");
  const int64_t N = qkv.size(0), H = qkv.size(1) / 3, d = H / num_heads;
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  for (const at::Tensor* t : {&c, &s})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 2 && t->size(0) == N && t->size(1) == d && d % 2 == 0,
                "rotary: cos and sin must be float32 [N, head size], the head size even");
  at::Tensor out = at::empty({2, N, H}, qkv.options());
  if (qkv.scalar_type() == at::kFloat)
    rotate_rows(qkv.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), N, H, num_heads,
                out.data_ptr<float>());
  else
    rotate_rows(qkv.data_ptr<c10::BFloat16>(), c.data_ptr<float>(), s.data_ptr<float>(), N, H, num_heads,
                out.data_ptr<c10::BFloat16>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bertforge, m) {
  m.def("rotary(Tensor qkv, Tensor cos, Tensor sin, int num_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(bertforge, CPU, m) { m.impl("rotary", rotary); }
