// Cross-entropy over a large vocabulary, for the masked-LM loss in training on CPU.
//
// torch computes F.cross_entropy(logits.float(), targets) on M rows of V logits as: a cast to
// float32 (for bf16 logits), a log-softmax that writes M x V floats, and a gather; its backward
// writes M x V floats for the log-softmax's gradient and casts them back. At V = 30,522 that is
// ~30 bytes of memory traffic per logit, about a tenth of a `mini` training step. Here each row is
// one task:
//   forward:  m = max_j x_j;  lse = m + log sum_j e^(x_j - m);  loss = lse - x_target
//             (two reads of the row; only the loss and lse are written, one float each per row)
//   backward: dx_j = g (e^(x_j - lse) - [j == target])  (one read, one write in the logits' dtype)
// Logits may be float32 or bfloat16; the arithmetic is float32. Rows are independent, so results
// are the same bit for bit at any thread count.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>

#include "simd.h"

namespace {

using namespace bertforge_simd;

// W logits from `x + b`, the lanes at or past V set to `fill` (nothing past the row is read).
template <typename T>
inline vf load_row(const T* x, int64_t b, int64_t V, float fill) {
  if (b + W <= V) return Io<T>::load(x + b);
  T tail[W];
  std::memset(static_cast<void*>(tail), 0, sizeof(tail));
  std::memcpy(static_cast<void*>(tail), x + b, (V - b) * sizeof(T));
  const vi live = (vi)lanes() < static_cast<int32_t>(V - b);
  return live ? Io<T>::load(tail) : splat(fill);
}

template <typename T>
void forward_rows(const T* logits, const int64_t* targets, float* losses, float* lse, int64_t M, int64_t V) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* x = logits + i * V;
      vf m = splat(neg_inf);
      for (int64_t b = 0; b < V; b += W) {
        const vf v = load_row(x, b, V, neg_inf);
        m = v > m ? v : m;
      }
      const float mx = hmax(m);
      const vf vmx = splat(mx);
      vf sum = {};
      for (int64_t b = 0; b < V; b += W) sum += exp_nonpositive(load_row(x, b, V, neg_inf) - vmx);
      lse[i] = mx + std::log(hsum(sum));
      losses[i] = lse[i] - static_cast<float>(x[targets[i]]);
    }
  });
}

template <typename T>
void backward_rows(const float* grad, const T* logits, const int64_t* targets, const float* lse, T* out, int64_t M,
                   int64_t V) {
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    T tail[W];
    for (int64_t i = begin; i < end; ++i) {
      const T* x = logits + i * V;
      T* y = out + i * V;
      const vf g = splat(grad[i]), l = splat(lse[i]);
      const int32_t t = static_cast<int32_t>(targets[i]);
      // softmax times g, less g at the target: computed in float32 and rounded once.
      auto block = [&](vf v, int64_t b) {
        const vi target = ((vi)lanes() + static_cast<int32_t>(b)) == t;
        return exp_nonpositive(v - l) * g - (target ? g : vf{});
      };
      int64_t b = 0;
      for (; b + W <= V; b += W) Io<T>::store(y + b, block(Io<T>::load(x + b), b));
      if (b < V) {  // the tail, through a buffer
        Io<T>::store(tail, block(load_row(x, b, V, 0.0f), b));
        std::memcpy(static_cast<void*>(y + b), tail, (V - b) * sizeof(T));
      }
    }
  });
}

void check_inputs(const at::Tensor& logits, const at::Tensor& targets) {
  TORCH_CHECK(logits.device().is_cpu() && logits.is_contiguous() && logits.dim() == 2 &&
                  (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16),
              "cross_entropy: logits must be a contiguous float32 or bfloat16 CPU tensor [M, V]");
  TORCH_CHECK(targets.device().is_cpu() && targets.is_contiguous() && targets.scalar_type() == at::kLong &&
                  targets.dim() == 1 && targets.size(0) == logits.size(0),
              "cross_entropy: targets must be a contiguous int64 tensor [M]");
  const int64_t V = logits.size(1);
  const int64_t* t = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < targets.size(0); ++i)
    TORCH_CHECK(t[i] >= 0 && t[i] < V, "cross_entropy: target ", t[i], " is out of bounds for ", V, " classes");
}

std::tuple<at::Tensor, at::Tensor> cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  check_inputs(logits, targets);
  const int64_t M = logits.size(0), V = logits.size(1);
  at::Tensor losses = at::empty({M}, logits.options().dtype(at::kFloat));
  at::Tensor lse = at::empty({M}, logits.options().dtype(at::kFloat));
  if (logits.scalar_type() == at::kFloat)
    forward_rows(logits.data_ptr<float>(), targets.data_ptr<int64_t>(), losses.data_ptr<float>(),
                 lse.data_ptr<float>(), M, V);
  else
    forward_rows(logits.data_ptr<c10::BFloat16>(), targets.data_ptr<int64_t>(), losses.data_ptr<float>(),
                 lse.data_ptr<float>(), M, V);
  return {losses, lse};
}

// into: where to write the gradient (the caller's reused memory, `kernels/scratch.py`), or none for a new tensor.
at::Tensor cross_entropy_backward(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& targets,
                                  const at::Tensor& lse, const std::optional<at::Tensor>& into) {
  check_inputs(logits, targets);
  const int64_t M = logits.size(0), V = logits.size(1);
  TORCH_CHECK(grad.scalar_type() == at::kFloat && grad.is_contiguous() && grad.numel() == M &&
                  lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.numel() == M,
              "cross_entropy_backward: grad and lse must be contiguous float32 [M]");
  if (into.has_value())
    TORCH_CHECK(into->scalar_type() == logits.scalar_type() && into->is_contiguous() && into->sizes() == logits.sizes() &&
                    !into->is_same(logits),
                "cross_entropy_backward: into must be a contiguous tensor of the logits' shape and dtype, not the logits");
  at::Tensor out = into.has_value() ? *into : at::empty_like(logits);
  if (logits.scalar_type() == at::kFloat)
    backward_rows(grad.data_ptr<float>(), logits.data_ptr<float>(), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
                  out.data_ptr<float>(), M, V);
  else
    backward_rows(grad.data_ptr<float>(), logits.data_ptr<c10::BFloat16>(), targets.data_ptr<int64_t>(),
                  lse.data_ptr<float>(), out.data_ptr<c10::BFloat16>(), M, V);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bertforge, m) {
  m.def("cross_entropy(Tensor logits, Tensor targets) -> (Tensor, Tensor)");
  m.def("cross_entropy_backward(Tensor grad, Tensor logits, Tensor targets, Tensor lse, Tensor? into=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(bertforge, CPU, m) {
  m.impl("cross_entropy", cross_entropy);
  m.impl("cross_entropy_backward", cross_entropy_backward);
}
