// Dropout whose mask is a hash of each element's index, for training on CPU.
//
// torch's CPU dropout draws a Bernoulli sample per element from its Mersenne-Twister stream,
// stores the mask and multiplies by it: about 5 ns an element, 10-20% of a BERT training step
// (docs/results.md). Here element i of a contiguous tensor is kept when
//     hash(i, key) >= threshold,   threshold = round(p * 2^32),
// hash being two rounds of a 32-bit integer mixer (xor-shift, multiply, xor-shift, multiply,
// xor-shift) keyed by the two halves of a 64-bit key the caller draws from torch's generator.
// So:
//   * the mask costs a few vector instructions per 16 elements and is never stored: the backward
//     pass is this same op applied to the gradient with the same key;
//   * each element depends on its index alone, so the output is the same bit for bit at any
//     thread count, and equal to `reference()` in kernels/dropout.py, which computes the same
//     hash in PyTorch's integer ops where this file cannot be compiled.
// Kept elements are multiplied by `scale` (1 / (1 - p)) in float32 and, for bfloat16, rounded
// back to nearest-even once, as torch's own `x * mask * scale` does.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "simd.h"

namespace {

using namespace bertforge_simd;

template <typename T>
void apply(const T* x, T* y, int64_t n, uint32_t k0, uint32_t k1, uint32_t threshold, float scale) {
  const int64_t blocks = (n + W - 1) / W;
  at::parallel_for(0, blocks, 1024, [&](int64_t begin, int64_t end) {
    T in[W], out[W];
    for (int64_t b = begin; b < end; ++b) {
      const int64_t start = b * W;
      const int64_t count = std::min<int64_t>(W, n - start);
      const vi keep = kept(static_cast<uint32_t>(start), k0, k1, threshold);
      if (count == W) {
        const vf v = Io<T>::load(x + start);
        Io<T>::store(y + start, keep ? v * scale : vf{});
      } else {  // the tail: through a zeroed buffer, so nothing past the end is read or written
        std::memset(static_cast<void*>(in), 0, sizeof(in));
        std::memcpy(static_cast<void*>(in), x + start, count * sizeof(T));
        const vf v = Io<T>::load(in);
        Io<T>::store(out, keep ? v * scale : vf{});
        std::memcpy(static_cast<void*>(y + start), out, count * sizeof(T));
      }
    }
  });
}

at::Tensor hashed_dropout(const at::Tensor& x, int64_t key, int64_t threshold, double scale) {
  TORCH_CHECK(x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "hashed_dropout takes a contiguous float32 or bfloat16 tensor");
  TORCH_CHECK(x.numel() <= (int64_t(1) << 32), "hashed_dropout indexes elements in 32 bits; got ", x.numel());
  TORCH_CHECK(threshold >= 0 && threshold <= 0xFFFFFFFFLL, "threshold must be in [0, 2^32)");
  at::Tensor y = at::empty_like(x);
  const auto k0 = static_cast<uint32_t>(static_cast<uint64_t>(key));
  const auto k1 = static_cast<uint32_t>(static_cast<uint64_t>(key) >> 32);
  if (x.scalar_type() == at::kFloat) {
    apply(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), k0, k1, static_cast<uint32_t>(threshold),
          static_cast<float>(scale));
  } else {
    apply(x.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(), x.numel(), k0, k1,
          static_cast<uint32_t>(threshold), static_cast<float>(scale));
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bertforge, m) {
  m.def("hashed_dropout(Tensor x, int key, int threshold, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(bertforge, CPU, m) { m.impl("hashed_dropout", hashed_dropout); }
