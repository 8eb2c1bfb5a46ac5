// Multi-head self-attention over unpadded sequences, for inference on CPU.
//
// The fused encoder keeps only real tokens between layers: q, k and v come out of one matmul as
// qkv [N, 3H], the N tokens of S sequences back to back (cu_seqlens says where each begins, as
// flash-attention's varlen kernels take it). In PyTorch ops, attention then needs the tokens
// scattered into a padded [3, heads, S, T, d] layout, a mask, two batched matmuls, a softmax
// and a gather back: five passes over memory for ~1% of BERT's FLOPs on short sentences.
// Here each (head, sequence) pair is one task that reads its rows of qkv where they lie and
// writes its rows of the context: no padding, no mask, no [S, T] layout of q, k or v.
// qkv and the context are float32 or bfloat16 (under bf16 autocast); the arithmetic is float32.
//
// One task, for a sequence of L tokens and head size d (the query is pre-scaled by 1/sqrt(d)):
//   1. k^T [d, Lp]: this head's keys transposed, Lp = L rounded up to the vector width, so the
//      scores of one query against 16 keys are one vector accumulated over d; its values
//      copied together beside it;
//   2. scores, softmax and p v for QB queries at a time: their dependency chains are
//      independent, so the FMA units are kept busy instead of waiting on one chain;
//   3. the softmax is exact up to rounding: the max is subtracted first; exp is Cephes' expf
//      (range reduction by ln 2, a degree-6 polynomial, about 1e-7 relative error), written
//      on vectors so it runs at the vector width.
//
// ModernBERT's layers add two things, both optional: rotary positions, applied to each query and
// key as the task reads it (no rotated copy of q and k is written by torch first), and a local
// window, within which only the key blocks a query group can reach are scored.
//
// Each task's arithmetic does not depend on how tasks are split over threads, so outputs are
// the same bit for bit at any thread count. Vectors are GCC/Clang vector extensions, so the
// same source compiles for AVX-512, AVX2 or SSE; the loader picks the flags.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention_blocks.h"
#include "simd.h"

namespace {

using namespace bertforge_simd;
using namespace bertforge_attention;

// Rotary positions (ModernBERT): each token's cos and sin, float32 [N, d] (each frequency used for
// dimensions c and c + d/2, as transformers lays them out), or none.
struct Rope {
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// One head of one sequence: rows [base, base + L) of qkv [N, 3H] -> the same rows of out [N, H],
// both of type T (float or bfloat16; the arithmetic is float32 either way). Queries, keys and values
// are read once into float32 buffers: keys transposed (kT), values together (vc), queries (qr) when
// they need converting or rotating. With `rope`, queries and keys are rotated on the way in. With
// window >= 0, query i sees only the keys j with |i - j| <= window, and only their blocks of W keys
// are scored: the cost grows as L * window, not L^2.
// kT holds d * (Lp + W) floats, vc L * d, qr (L + 1) * d and p QB * (Lp + W), all owned by the
// calling thread.
template <int D, typename T>
void attend(const T* qkv, T* out, int64_t base, int64_t L, int64_t h, int64_t H, int64_t d,
            Rope rope, int64_t window, float* kT, float* vc, float* qr, float* p) {
  // ld: the row stride of kT and p, one vector past Lp, so that the d rows of kT a score reads do
  // not all fall in one L1 set at a power-of-two Lp.
  const int64_t row = 3 * H, Lp = (L + W - 1) / W * W, ld = Lp + W, blocks = Lp / W;
  const T* q0 = qkv + base * row + h * d;
  const T* k0 = q0 + H;
  const T* v0 = q0 + 2 * H;
  for (int64_t c = 0; c < d; ++c) std::fill(kT + c * ld + L, kT + c * ld + Lp, 0.0f);
  if (rope.cos != nullptr) {
    float* turned = qr + L * d;  // the spare row
    for (int64_t j = 0; j < L; ++j) {
      const int64_t at = (base + j) * d;
      rotate_row(k0 + j * row, rope.cos + at, rope.sin + at, d, turned);
      for (int64_t c = 0; c < d; ++c) kT[c * ld + j] = turned[c];
      rotate_row(q0 + j * row, rope.cos + at, rope.sin + at, d, qr + j * d);
    }
  } else {
    for (int64_t j = 0; j < L; ++j)
      for (int64_t c = 0; c < d; ++c) kT[c * ld + j] = static_cast<float>(k0[j * row + c]);
  }
  // Float queries without rotation are read where they lie; any other kind was written to qr.
  constexpr bool in_place = std::is_same_v<T, float>;
  if (!in_place && rope.cos == nullptr)
    for (int64_t j = 0; j < L; ++j)
      for (int64_t c = 0; c < d; ++c) qr[j * d + c] = static_cast<float>(q0[j * row + c]);
  const float* qs = qr;  // where query i's row starts: qs + i * qstride
  int64_t qstride = d;
  if constexpr (in_place) {
    if (rope.cos == nullptr) {
      qs = q0;
      qstride = row;
    }
  }
  // This head's values, copied together: read in place, each of L rows lies 3H floats from the
  // last, and at L = 2,048 the p v loop missed the TLB on every row (1.7x slower than copied).
  for (int64_t j = 0; j < L; ++j)
    for (int64_t c = 0; c < d; ++c) vc[j * d + c] = static_cast<float>(v0[j * row + c]);
  // Lanes of the last key block past the sequence's end: -inf before the max, 0 after the exp.
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const vi live = lane < static_cast<int32_t>(L - (blocks - 1) * W);
  const vf neg_inf = splat(-std::numeric_limits<float>::infinity());
  for (int64_t i0 = 0; i0 < L; i0 += QB) {
    const int rows = static_cast<int>(std::min<int64_t>(QB, L - i0));
    const float* q[QB];  // a short last group repeats its last query and stores only `rows`
    int32_t at[QB];
    for (int r = 0; r < QB; ++r) {
      at[r] = static_cast<int32_t>(std::min<int64_t>(i0 + r, L - 1));
      q[r] = qs + at[r] * qstride;
    }
    // The key blocks [b0, b1) any of these queries can see.
    int64_t b0 = 0, b1 = blocks;
    if (window >= 0) {
      b0 = std::max<int64_t>(0, i0 - window) / W;
      b1 = (std::min<int64_t>(L, i0 + rows + window) + W - 1) / W;
    }
    const int64_t nb = b1 - b0;
    for (int64_t b = b0; b < b1; ++b) {
      vf acc[QB] = {};
      for (int64_t c = 0; c < d; ++c) {
        const vf k = load(kT + c * ld + b * W);
        for (int r = 0; r < QB; ++r) acc[r] += q[r][c] * k;
      }
      if (window >= 0) {
        const vi j = lane + static_cast<int32_t>(b * W);
        for (int r = 0; r < QB; ++r) {
          const vi seen = (j >= static_cast<int32_t>(at[r] - window)) & (j <= static_cast<int32_t>(at[r] + window)) &
                          (j < static_cast<int32_t>(L));
          acc[r] = seen ? acc[r] : neg_inf;
        }
      } else if (b == blocks - 1) {
        for (int r = 0; r < QB; ++r) acc[r] = live ? acc[r] : neg_inf;
      }
      for (int r = 0; r < QB; ++r) store(p + r * ld + (b - b0) * W, acc[r]);
    }
    float inv[QB];
    softmax_rows(p, ld, nb, inv);
    const int64_t first = b0 * W, last = std::min<int64_t>(L, b1 * W);
    weighted_values<D>(vc + first * d, d, last - first, p, ld, inv, rows, d, out + (base + i0) * H + h * d, H);
  }
}

at::Tensor varlen_attention(const at::Tensor& qkv, const at::Tensor& cu_seqlens, int64_t num_heads,
                            const std::optional<at::Tensor>& cos, const std::optional<at::Tensor>& sin,
                            int64_t window) {
  TORCH_CHECK(qkv.device().is_cpu() && (qkv.scalar_type() == at::kFloat || qkv.scalar_type() == at::kBFloat16) &&
                  qkv.dim() == 2 && qkv.is_contiguous(),
              "varlen_attention: qkv must be a contiguous float32 or bfloat16 CPU tensor [N, 3H]");
  TORCH_CHECK(num_heads > 0 && qkv.size(1) % (3 * num_heads) == 0, "varlen_attention: 3H must split into 3 x heads");
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1, "varlen_attention: cu_seqlens must run from 0 to N");
  const at::Tensor cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t N = qkv.size(0), H = qkv.size(1) / 3, d = H / num_heads, S = cu.numel() - 1;
  const int64_t* starts = cu.data_ptr<int64_t>();
  TORCH_CHECK(starts[0] == 0 && starts[S] == N, "varlen_attention: cu_seqlens must run from 0 to N");
  int64_t max_len = 0;
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK(starts[s + 1] > starts[s], "varlen_attention: every sequence needs a token");
    max_len = std::max(max_len, starts[s + 1] - starts[s]);
  }
  TORCH_CHECK(cos.has_value() == sin.has_value(), "varlen_attention: give both cos and sin, or neither");
  at::Tensor cos_c, sin_c;
  Rope rope;
  if (cos.has_value()) {
    cos_c = cos->contiguous();
    sin_c = sin->contiguous();
    for (const at::Tensor* t : {&cos_c, &sin_c})
      TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 2 && t->size(0) == N && t->size(1) == d && d % 2 == 0,
                  "varlen_attention: cos and sin must be float32 [N, head size], the head size even");
    rope.cos = cos_c.data_ptr<float>();
    rope.sin = sin_c.data_ptr<float>();
  }
  const int64_t Lp = (max_len + W - 1) / W * W;
  at::Tensor out = at::empty({N, H}, qkv.options());
  const bool convert = qkv.scalar_type() != at::kFloat || rope.cos != nullptr;  // queries go through qr
  // Tasks in head-major order: with as many threads as heads or fewer, each thread's share is
  // whole heads over every sequence, so long and short sequences are spread evenly.
  auto run = [&](auto* src, auto* dst) {
    at::parallel_for(0, S * num_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> kT(d * (Lp + W)), vc(max_len * d), p(QB * (Lp + W)), qr(convert ? (max_len + 1) * d : 0);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t h = task / S, s = task % S, L = starts[s + 1] - starts[s];
        if (d == 32)
          attend<32>(src, dst, starts[s], L, h, H, d, rope, window, kT.data(), vc.data(), qr.data(), p.data());
        else if (d == 64)
          attend<64>(src, dst, starts[s], L, h, H, d, rope, window, kT.data(), vc.data(), qr.data(), p.data());
        else
          attend<0>(src, dst, starts[s], L, h, H, d, rope, window, kT.data(), vc.data(), qr.data(), p.data());
      }
    });
  };
  if (qkv.scalar_type() == at::kFloat)
    run(qkv.data_ptr<float>(), out.data_ptr<float>());
  else
    run(qkv.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>());
  return out;
}

}  // namespace

TORCH_LIBRARY(bertforge, m) {
  m.def("varlen_attention(Tensor qkv, Tensor cu_seqlens, int num_heads, Tensor? cos=None, Tensor? sin=None, "
        "int window=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(bertforge, CPU, m) { m.impl("varlen_attention", varlen_attention); }
