// Multi-head self-attention over unpadded sequences for training on CPU: forward and backward,
// with attention dropout hashed into both.
//
// Training attention in PyTorch ops scatters the real tokens into a padded [S, T] layout, then
// keeps the [S, heads, T, T] scores, probabilities and dropout mask of every layer for the
// backward pass, padding included, and walks them in a dozen elementwise passes (scale, mask,
// softmax, dropout, and each one's gradient). Here one task per (sequence, head) reads its rows
// of q, k and v [N, H] where they lie, and:
//   forward:  P = softmax(scale q k^T) over the sequence's L keys;
//             out = (P * keep * c) v                         c = 1 / (1 - p)
//   backward: with Pd = P * keep * c and dPd = dout v^T:
//             dv = Pd^T dout;  dP = dPd * keep * c;  dS = P * (dP - rowsum(dP * P));
//             dq = scale dS k;  dk = scale dS^T q.
// The only thing kept between the two is P, nh * L^2 floats per sequence and none for padding:
// `probs` [sum_s nh L_s^2], sequence s's head h being the row-major L x L block at
// nh * (sum of the earlier sequences' L^2) + h * L^2. The dropout mask is never stored: element
// (i, j) of that block is kept when hash(its index in `probs`, key) >= threshold (simd.h), so
// the backward pass recomputes it, and kernels/attention.py's torch-ops reference draws the same
// mask from the same index.
//
// Inputs may be float32 or bfloat16 (autocast's linear layers give bf16); the arithmetic is
// float32, and q, k, v, out and the gradients keep the inputs' dtype. On bf16 inputs with head
// sizes 32, 64 or 128, where the CPU has AMX, the six products run on its tiles instead (amx.h:
// bf16 products, float32 sums; P and dS rounded to bf16 for theirs); the rest is the same. Each task's
// arithmetic is independent of the others, so results are the same bit for bit at any thread
// count; tasks write disjoint rows and columns of the outputs.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "simd.h"

namespace {

using namespace bertforge_simd;

constexpr int RB = 4;  // rows computed together: independent FMA chains keep the units busy

// out[i, j] = a_i . bT[:, j] for i < L, j < Lp: a is [L, d] by rows, bT [d, Lp] (zero past L).
// Two column vectors at a time where there are two: eight accumulators per loaded pair.
template <int C>
void rows_by_columns(const float* a, const float* bT, int64_t L, int64_t Lp, float* out) {
  constexpr int d = C * W;
  for (int64_t i0 = 0; i0 < L; i0 += RB) {
    const int rows = static_cast<int>(std::min<int64_t>(RB, L - i0));
    const float* ar[RB];  // a short last group repeats its last row and stores only `rows`
    for (int r = 0; r < RB; ++r) ar[r] = a + std::min<int64_t>(i0 + r, L - 1) * d;
    int64_t b = 0;
    for (; b + 2 * W <= Lp; b += 2 * W) {
      vf acc[RB][2] = {};
      for (int c = 0; c < d; ++c) {
        const vf lo = load(bT + c * Lp + b), hi = load(bT + c * Lp + b + W);
        for (int r = 0; r < RB; ++r) {
          const vf x = splat(ar[r][c]);
          acc[r][0] += x * lo;
          acc[r][1] += x * hi;
        }
      }
      for (int r = 0; r < rows; ++r) {
        store(out + (i0 + r) * Lp + b, acc[r][0]);
        store(out + (i0 + r) * Lp + b + W, acc[r][1]);
      }
    }
    for (; b < Lp; b += W) {
      vf acc[RB] = {};
      for (int c = 0; c < d; ++c) {
        const vf col = load(bT + c * Lp + b);
        for (int r = 0; r < RB; ++r) acc[r] += ar[r][c] * col;
      }
      for (int r = 0; r < rows; ++r) store(out + (i0 + r) * Lp + b, acc[r]);
    }
  }
}

// out_i = sum_{j < L} m[i, j] b_j: m [L, Lp], b and out [L, d] by rows.
template <int C>
void weights_by_rows(const float* m, const float* b, int64_t L, int64_t Lp, float* out) {
  constexpr int d = C * W;
  for (int64_t i0 = 0; i0 < L; i0 += RB) {
    const int rows = static_cast<int>(std::min<int64_t>(RB, L - i0));
    const float* mr[RB];
    for (int r = 0; r < RB; ++r) mr[r] = m + std::min<int64_t>(i0 + r, L - 1) * Lp;
    vf acc[RB][C] = {};
    for (int64_t j = 0; j < L; ++j) {
      vf bj[C];
      for (int c = 0; c < C; ++c) bj[c] = load(b + j * d + c * W);
      for (int r = 0; r < RB; ++r) {
        const float w = mr[r][j];
        for (int c = 0; c < C; ++c) acc[r][c] += w * bj[c];
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < C; ++c) store(out + (i0 + r) * d + c * W, acc[r][c]);
  }
}

// out_j = sum_{i < L} m[i, j] b_i (the transposed weights): m [L, Lp], b and out [L, d] by rows.
template <int C>
void transposed_weights_by_rows(const float* m, const float* b, int64_t L, int64_t Lp, float* out) {
  constexpr int d = C * W;
  for (int64_t j0 = 0; j0 < L; j0 += RB) {
    const int rows = static_cast<int>(std::min<int64_t>(RB, L - j0));
    int64_t col[RB];
    for (int r = 0; r < RB; ++r) col[r] = std::min<int64_t>(j0 + r, L - 1);
    vf acc[RB][C] = {};
    for (int64_t i = 0; i < L; ++i) {
      vf bi[C];
      for (int c = 0; c < C; ++c) bi[c] = load(b + i * d + c * W);
      const float* mi = m + i * Lp;
      for (int r = 0; r < RB; ++r) {
        const float w = mi[col[r]];
        for (int c = 0; c < C; ++c) acc[r][c] += w * bi[c];
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < C; ++c) store(out + (j0 + r) * d + c * W, acc[r][c]);
  }
}

// Rows [base, base + L), head h's columns of x [N, H] -> float [L, d] by rows, times `scale`.
template <typename T, int C>
void gather_rows(const T* x, int64_t base, int64_t L, int64_t h, int64_t H, float scale, float* out) {
  constexpr int d = C * W;
  for (int64_t i = 0; i < L; ++i)
    for (int c = 0; c < C; ++c) store(out + i * d + c * W, Io<T>::load(x + (base + i) * H + h * d + c * W) * scale);
}

// The same rows, transposed: float [d, Lp], zero in the columns past L.
template <typename T, int C>
void gather_columns(const T* x, int64_t base, int64_t L, int64_t Lp, int64_t h, int64_t H, float* out) {
  constexpr int d = C * W;
  for (int c = 0; c < d; ++c) std::fill(out + c * Lp + L, out + (c + 1) * Lp, 0.0f);
  for (int64_t j = 0; j < L; ++j) {
    const T* row = x + (base + j) * H + h * d;
    for (int c = 0; c < d; ++c) out[c * Lp + j] = static_cast<float>(row[c]);
  }
}

// float [L, d] by rows -> rows [base, base + L), head h's columns of y [N, H].
template <typename T, int C>
void scatter_rows(const float* in, int64_t base, int64_t L, int64_t h, int64_t H, T* y) {
  constexpr int d = C * W;
  for (int64_t i = 0; i < L; ++i)
    for (int c = 0; c < C; ++c) Io<T>::store(y + (base + i) * H + h * d + c * W, load(in + i * d + c * W));
}

using namespace bertforge_amx;

struct Dropout {
  uint32_t k0, k1, threshold;
  float scale;  // 1 / (1 - p)
  bool on() const { return threshold != 0; }
};

inline vi kept_lanes(uint32_t start, const Dropout& drop) { return kept(start, drop.k0, drop.k1, drop.threshold); }

// Where each (sequence, head) task's tokens and probabilities are.
struct Task {
  int64_t base, L;       // its first token and its length
  int64_t h;             // its head
  uint32_t first;        // index of its probabilities' (0, 0) element in `probs`
};

// Per-thread scratch, sized for the longest sequence.
struct Scratch {
  std::vector<float> a, b, c, d, e, f, g;
  // The AMX path's bf16 operands (amx.h), sized for K padded to 32: two A operands, two B operands.
  std::vector<BF16> rows_a, rows_b;
  std::vector<word> pairs_a, pairs_b;
  Scratch(int64_t d_, int64_t Lp, bool amx)
      : a(Lp * d_), b(Lp * d_), c(Lp * d_), d(Lp * d_), e(Lp * Lp), f(Lp * Lp), g(Lp),
        rows_a(amx ? round_up(Lp, 32) * std::max<int64_t>(Lp, d_) : 0),
        rows_b(amx ? round_up(Lp, 32) * d_ : 0),
        pairs_a(amx ? round_up(Lp, 32) / 2 * std::max<int64_t>(Lp, d_) : 0),
        pairs_b(amx ? round_up(Lp, 32) / 2 * d_ : 0) {}
};

// Softmax of each of the L score rows p [L, Lp] in place, after multiplying them by `scale`
// (1 where the scale is already in q); keys past L take no weight. P is copied out to `kept`
// [L, L] for the backward pass; then the dropout mask and scale are applied to the rows in p,
// which the product with v reads next.
void softmax_keeping(float* p, int64_t L, int64_t Lp, float scale, float* kept, uint32_t first, const Dropout& drop) {
  const vi last_live = lanes() < vu{} + static_cast<uint32_t>(L - (Lp - W));
  const vf neg_inf = splat(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < L; ++i) {
    float* row = p + i * Lp;
    if (scale != 1.0f)
      for (int64_t b = 0; b < Lp; b += W) store(row + b, load(row + b) * scale);
    store(row + Lp - W, last_live ? load(row + Lp - W) : neg_inf);
    vf m = load(row);
    for (int64_t b = W; b < Lp; b += W) { const vf x = load(row + b); m = x > m ? x : m; }
    const vf mx = splat(hmax(m));
    vf sum = {};
    for (int64_t b = 0; b < Lp; b += W) {
      const vf e = exp_nonpositive(load(row + b) - mx);
      store(row + b, e);
      sum += e;
    }
    const float inv = 1.0f / hsum(sum);
    for (int64_t b = 0; b < Lp; b += W) store(row + b, load(row + b) * inv);
    std::memcpy(kept + i * L, row, L * sizeof(float));  // P for the backward pass, no padding
    if (drop.on())
      for (int64_t b = 0; b < Lp; b += W) {
        const vi keep = kept_lanes(first + static_cast<uint32_t>(i * L + b), drop);
        store(row + b, keep ? load(row + b) * drop.scale : vf{});
      }
  }
}

// From g = dPd [L, Lp] (dout v^T) and the kept P [L, L]: pd = P * keep * c (what multiplied v)
// and, in place of g, dS = scale * P * (dP - rowsum(dP * P)) with dP = dPd * keep * c; both zero
// past column L. `prow` is scratch for one row.
void softmax_gradient(float* g, float* pd, float* prow, const float* kept, int64_t L, int64_t Lp, uint32_t first,
                      float scale, const Dropout& drop) {
  for (int64_t i = 0; i < L; ++i) {
    std::memcpy(prow, kept + i * L, L * sizeof(float));
    std::fill(prow + L, prow + Lp, 0.0f);  // no probability, so no gradient, past the end
    float* gi = g + i * Lp;
    float* pdi = pd + i * Lp;
    vf dot = {};
    for (int64_t b = 0; b < Lp; b += W) {
      const vf pv = load(prow + b);
      vf dp = load(gi + b);
      if (drop.on()) {
        const vi keep = kept_lanes(first + static_cast<uint32_t>(i * L + b), drop);
        store(pdi + b, keep ? pv * drop.scale : vf{});
        dp = keep ? dp * drop.scale : vf{};
      } else {
        store(pdi + b, pv);
      }
      store(gi + b, dp);
      dot += dp * pv;
    }
    const vf rowdot = splat(hsum(dot));
    for (int64_t b = 0; b < Lp; b += W) store(gi + b, load(prow + b) * (load(gi + b) - rowdot) * scale);
  }
}

template <typename T, int C>
void forward_task(const T* q, const T* k, const T* v, T* out, float* probs, const Task& t, int64_t H,
                  float scale, const Dropout& drop, Scratch& s) {
  constexpr int d = C * W;
  const int64_t L = t.L, Lp = (L + W - 1) / W * W;
  float *qf = s.a.data(), *kT = s.b.data(), *vf_ = s.c.data(), *of = s.d.data(), *p = s.e.data();
  gather_rows<T, C>(q, t.base, L, t.h, H, scale, qf);  // the scale folded into q once
  gather_columns<T, C>(k, t.base, L, Lp, t.h, H, kT);
  gather_rows<T, C>(v, t.base, L, t.h, H, 1.0f, vf_);
  rows_by_columns<C>(qf, kT, L, Lp, p);
  softmax_keeping(p, L, Lp, 1.0f, probs + t.first, t.first, drop);  // the scale is in qf
  weights_by_rows<C>(p, vf_, L, Lp, of);
  scatter_rows<T, C>(of, t.base, L, t.h, H, out);
}

template <typename T, int C>
void backward_task(const T* grad, const T* q, const T* k, const T* v, const float* probs, T* dq, T* dk, T* dv,
                   const Task& t, int64_t H, float scale, const Dropout& drop, Scratch& s) {
  const int64_t L = t.L, Lp = (L + W - 1) / W * W;
  float *gf = s.a.data(), *vT = s.b.data(), *rows_a = s.c.data(), *rows_b = s.d.data();
  float *ds = s.e.data(), *pd = s.f.data(), *prow = s.g.data();
  gather_rows<T, C>(grad, t.base, L, t.h, H, 1.0f, gf);
  gather_columns<T, C>(v, t.base, L, Lp, t.h, H, vT);
  rows_by_columns<C>(gf, vT, L, Lp, ds);  // dPd = dout v^T
  softmax_gradient(ds, pd, prow, probs + t.first, L, Lp, t.first, scale, drop);
  transposed_weights_by_rows<C>(pd, gf, L, Lp, rows_a);  // dv = Pd^T dout
  scatter_rows<T, C>(rows_a, t.base, L, t.h, H, dv);
  gather_rows<T, C>(k, t.base, L, t.h, H, 1.0f, rows_b);
  weights_by_rows<C>(ds, rows_b, L, Lp, rows_a);  // dq = dS k (the scale is in dS)
  scatter_rows<T, C>(rows_a, t.base, L, t.h, H, dq);
  gather_rows<T, C>(q, t.base, L, t.h, H, 1.0f, rows_b);
  transposed_weights_by_rows<C>(ds, rows_b, L, Lp, rows_a);  // dk = dS^T q
  scatter_rows<T, C>(rows_a, t.base, L, t.h, H, dk);
}

// Whether bf16 inputs with head sizes a multiple of 32 take the AMX tile products (amx.h): on
// where the CPU and the kernel allow them, unless switched off (`attention_amx(0)`, for comparing
// both paths in one process).
std::atomic<bool> amx_wanted{true};

bool use_amx(at::ScalarType dtype, int64_t d) {
  return dtype == at::kBFloat16 && d % 32 == 0 && amx_wanted.load(std::memory_order_relaxed) && amx_supported();
}

// float [d, ld] (ld % W == 0) -> rows [base, base + L) of head h of y [N, H]: y_j[c] = in[c, j],
// rounded once. The rounding runs on whole vectors into `scratch` [d, ld]; only the transposing
// copy is element by element.
void scatter_columns(const float* in, int64_t ld, int64_t base, int64_t L, int64_t h, int64_t H, int64_t d,
                     BF16* scratch, BF16* y) {
  for (int64_t c = 0; c < d; ++c)
    for (int64_t b = 0; b < ld; b += W) Io<BF16>::store(scratch + c * ld + b, load(in + c * ld + b));
  for (int64_t j = 0; j < L; ++j) {
    BF16* row = y + (base + j) * H + h * d;
    for (int64_t c = 0; c < d; ++c) row[c] = scratch[c * ld + j];
  }
}

#ifdef BERTFORGE_AMX
// forward_task for bf16 q, k, v on AMX tiles: q k^T and P v as bf16 products with float32 sums.
// P (after dropout) is rounded to bf16 for its product with v, as autocast's matmuls would round
// it; the scale multiplies the float32 scores. Queries and keys are padded to Lp = L rounded up
// to 16, and P's columns, the products' inner dimension, to Lk = L rounded up to 32.
template <int C>
AMX_TARGET void forward_task_amx(const BF16* q, const BF16* k, const BF16* v, BF16* out, float* probs, const Task& t,
                                 int64_t H, float scale, const Dropout& drop, Scratch& s) {
  constexpr int d = C * W;
  const int64_t L = t.L, Lp = round_up(L, W), Lk = round_up(L, 32);
  float *of = s.d.data(), *p = s.e.data();
  BF16 *qa = s.rows_b.data(), *pa = s.rows_a.data();
  word *kb = s.pairs_a.data(), *vb = s.pairs_b.data();
  copy_rows(q, t.base, L, t.h, H, d, Lp, qa);
  pair_columns(k, t.base, L, t.h, H, d, Lp, kb);
  amx_gemm(qa, d, kb, Lp, p, Lp, Lp, Lp, d);  // scores [Lp, Lp]
  softmax_keeping(p, L, Lp, scale, probs + t.first, t.first, drop);
  round_rows(p, L, Lp, Lp, Lk, pa);
  pair_rows(v, t.base, L, t.h, H, d, Lk, vb);
  amx_gemm(pa, Lk, vb, d, of, d, Lp, d, Lk);  // out = Pd v
  scatter_rows<BF16, C>(of, t.base, L, t.h, H, out);
}

// backward_task on AMX tiles. dv and dk come out transposed (dv^T = dout^T Pd, dk^T = q^T dS),
// so that Pd and dS, the large operands, are packed by rows in one vector pass each.
template <int C>
AMX_TARGET void backward_task_amx(const BF16* grad, const BF16* q, const BF16* k, const BF16* v, const float* probs,
                                  BF16* dq, BF16* dk, BF16* dv, const Task& t, int64_t H, float scale,
                                  const Dropout& drop, Scratch& s) {
  constexpr int d = C * W;
  const int64_t L = t.L, Lp = round_up(L, W), Lk = round_up(L, 32);
  float *rows = s.d.data(), *cols = s.c.data(), *ds = s.e.data(), *pd = s.f.data(), *prow = s.g.data();
  BF16 *a_small = s.rows_b.data(), *a_large = s.rows_a.data();
  word *b_large = s.pairs_a.data(), *b_small = s.pairs_b.data();
  copy_rows(grad, t.base, L, t.h, H, d, Lp, a_small);
  pair_columns(v, t.base, L, t.h, H, d, Lp, b_large);
  amx_gemm(a_small, d, b_large, Lp, ds, Lp, Lp, Lp, d);  // dPd = dout v^T
  softmax_gradient(ds, pd, prow, probs + t.first, L, Lp, t.first, scale, drop);
  copy_transposed(grad, t.base, L, t.h, H, d, Lk, a_small);
  round_pair_rows(pd, L, Lp, Lk, b_large);
  amx_gemm(a_small, Lk, b_large, Lp, cols, Lp, d, Lp, Lk);  // dv^T = dout^T Pd
  scatter_columns(cols, Lp, t.base, L, t.h, H, d, a_small, dv);  // dout^T is spent
  round_rows(ds, L, Lp, Lp, Lk, a_large);
  pair_rows(k, t.base, L, t.h, H, d, Lk, b_small);
  amx_gemm(a_large, Lk, b_small, d, rows, d, Lp, d, Lk);  // dq = dS k (the scale is in dS)
  scatter_rows<BF16, C>(rows, t.base, L, t.h, H, dq);
  copy_transposed(q, t.base, L, t.h, H, d, Lk, a_small);
  round_pair_rows(ds, L, Lp, Lk, b_large);
  amx_gemm(a_small, Lk, b_large, Lp, cols, Lp, d, Lp, Lk);  // dk^T = q^T dS
  scatter_columns(cols, Lp, t.base, L, t.h, H, d, a_small, dk);  // q^T is spent
}
#endif  // BERTFORGE_AMX

// The tasks in head-major order (a thread's share is whole heads over every sequence, so long
// and short sequences spread evenly), the longest length, and the probabilities' size.
std::vector<Task> plan(const at::Tensor& q, const at::Tensor& cu_seqlens, int64_t num_heads, int64_t& max_len,
                       int64_t& total) {
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 2,
              "varlen_attention_train: cu_seqlens must run from 0 to N");
  const at::Tensor cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t* starts = cu.data_ptr<int64_t>();
  const int64_t S = cu.numel() - 1;
  TORCH_CHECK(starts[0] == 0 && starts[S] == q.size(0), "varlen_attention_train: cu_seqlens must run from 0 to N");
  std::vector<int64_t> first(S);
  max_len = total = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t L = starts[s + 1] - starts[s];
    TORCH_CHECK(L > 0, "varlen_attention_train: every sequence needs a token");
    first[s] = total;
    total += num_heads * L * L;
    max_len = std::max(max_len, L);
  }
  TORCH_CHECK(total <= (int64_t(1) << 32), "varlen_attention_train: the probabilities are indexed in 32 bits");
  std::vector<Task> tasks;
  tasks.reserve(S * num_heads);
  for (int64_t h = 0; h < num_heads; ++h)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t L = starts[s + 1] - starts[s];
      tasks.push_back({starts[s], L, h, static_cast<uint32_t>(first[s] + h * L * L)});
    }
  return tasks;
}

void check(const at::Tensor& x, const at::Tensor& like, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() == 2 && x.sizes() == like.sizes() &&
                  x.scalar_type() == like.scalar_type(),
              "varlen_attention_train: ", name, " must be a contiguous CPU tensor shaped and typed as q");
}

int64_t head_size(const at::Tensor& q, int64_t num_heads) {
  TORCH_CHECK(q.device().is_cpu() && q.is_contiguous() && q.dim() == 2 &&
                  (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "varlen_attention_train: q must be a contiguous float32 or bfloat16 CPU tensor [N, H]");
  TORCH_CHECK(num_heads > 0 && q.size(1) % num_heads == 0, "varlen_attention_train: H must split into heads");
  const int64_t d = q.size(1) / num_heads;
  TORCH_CHECK(d == 16 || d == 32 || d == 64 || d == 128, "varlen_attention_train: head size must be 16, 32, 64 or 128");
  return d;
}

Dropout dropout_of(int64_t key, int64_t threshold, double keep_scale) {
  TORCH_CHECK(threshold >= 0 && threshold <= 0xFFFFFFFFLL, "varlen_attention_train: threshold must be in [0, 2^32)");
  return {static_cast<uint32_t>(static_cast<uint64_t>(key)), static_cast<uint32_t>(static_cast<uint64_t>(key) >> 32),
          static_cast<uint32_t>(threshold), static_cast<float>(keep_scale)};
}

// Job<T, C>::run(args...) for the tensors' dtype T and head size d = C * W.
template <template <typename, int> class Job, typename... Args>
void dispatch(at::ScalarType dtype, int64_t d, Args&&... args) {
  const bool bf16 = dtype == at::kBFloat16;
  switch (d / W) {
    case 1: bf16 ? Job<c10::BFloat16, 1>::run(args...) : Job<float, 1>::run(args...); break;
    case 2: bf16 ? Job<c10::BFloat16, 2>::run(args...) : Job<float, 2>::run(args...); break;
    case 4: bf16 ? Job<c10::BFloat16, 4>::run(args...) : Job<float, 4>::run(args...); break;
    default: bf16 ? Job<c10::BFloat16, 8>::run(args...) : Job<float, 8>::run(args...); break;
  }
}

template <typename T, int C>
struct Forward {
  static void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& probs,
                  const std::vector<Task>& tasks, int64_t Lp, float scale, const Dropout& drop) {
    const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
    T* op = out.data_ptr<T>();
    float* pp = probs.data_ptr<float>();
    const int64_t H = q.size(1);
    const bool amx = use_amx(q.scalar_type(), C * W);
    at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
      Scratch s(C * W, Lp, amx);
#ifdef BERTFORGE_AMX
      if constexpr (std::is_same_v<T, BF16> && C % 2 == 0)
        if (amx) {
          amx_begin();
          for (int64_t i = begin; i < end; ++i) forward_task_amx<C>(qp, kp, vp, op, pp, tasks[i], H, scale, drop, s);
          amx_end();
          return;
        }
#endif
      for (int64_t i = begin; i < end; ++i) forward_task<T, C>(qp, kp, vp, op, pp, tasks[i], H, scale, drop, s);
    });
  }
};

template <typename T, int C>
struct Backward {
  static void run(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& probs, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                  const std::vector<Task>& tasks, int64_t Lp, float scale, const Dropout& drop) {
    const T *gp = grad.data_ptr<T>(), *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
    T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv.data_ptr<T>();
    const float* pp = probs.data_ptr<float>();
    const int64_t H = q.size(1);
    const bool amx = use_amx(q.scalar_type(), C * W);
    at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
      Scratch s(C * W, Lp, amx);
#ifdef BERTFORGE_AMX
      if constexpr (std::is_same_v<T, BF16> && C % 2 == 0)
        if (amx) {
          amx_begin();
          for (int64_t i = begin; i < end; ++i)
            backward_task_amx<C>(gp, qp, kp, vp, pp, dqp, dkp, dvp, tasks[i], H, scale, drop, s);
          amx_end();
          return;
        }
#endif
      for (int64_t i = begin; i < end; ++i)
        backward_task<T, C>(gp, qp, kp, vp, pp, dqp, dkp, dvp, tasks[i], H, scale, drop, s);
    });
  }
};

std::tuple<at::Tensor, at::Tensor> varlen_attention_train(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                          const at::Tensor& cu_seqlens, int64_t num_heads, double scale,
                                                          int64_t key, int64_t threshold, double keep_scale) {
  const int64_t d = head_size(q, num_heads);
  check(k, q, "k");
  check(v, q, "v");
  int64_t max_len, total;
  const std::vector<Task> tasks = plan(q, cu_seqlens, num_heads, max_len, total);
  const Dropout drop = dropout_of(key, threshold, keep_scale);
  at::Tensor out = at::empty_like(q);
  at::Tensor probs = at::empty({total}, q.options().dtype(at::kFloat));
  const int64_t Lp = (max_len + W - 1) / W * W;
  dispatch<Forward>(q.scalar_type(), d, q, k, v, out, probs, tasks, Lp, static_cast<float>(scale), drop);
  return {out, probs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_train_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& probs,
    const at::Tensor& cu_seqlens, int64_t num_heads, double scale, int64_t key, int64_t threshold, double keep_scale) {
  const int64_t d = head_size(q, num_heads);
  check(grad, q, "grad");
  check(k, q, "k");
  check(v, q, "v");
  int64_t max_len, total;
  const std::vector<Task> tasks = plan(q, cu_seqlens, num_heads, max_len, total);
  TORCH_CHECK(probs.is_contiguous() && probs.scalar_type() == at::kFloat && probs.numel() == total,
              "varlen_attention_train_backward: probs must be the forward pass's");
  const Dropout drop = dropout_of(key, threshold, keep_scale);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(q), dv = at::empty_like(q);
  const int64_t Lp = (max_len + W - 1) / W * W;
  dispatch<Backward>(q.scalar_type(), d, grad, q, k, v, probs, dq, dk, dv, tasks, Lp, static_cast<float>(scale), drop);
  return {dq, dk, dv};
}

// mode 0 or 1 switches the AMX path off or on (-1 leaves it); returns whether bf16 inputs with
// head sizes a multiple of 32 take it now (on, and the CPU and the kernel allow it).
bool attention_amx(int64_t mode) {
  TORCH_CHECK(mode >= -1 && mode <= 1, "attention_amx: mode must be -1, 0 or 1");
  if (mode >= 0) amx_wanted.store(mode == 1);
  return use_amx(at::kBFloat16, 32);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bertforge, m) {
  m.def("varlen_attention_train(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, int num_heads, float scale, "
        "int key, int threshold, float keep_scale) -> (Tensor, Tensor)");
  m.def("varlen_attention_train_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor probs, Tensor cu_seqlens, "
        "int num_heads, float scale, int key, int threshold, float keep_scale) -> (Tensor, Tensor, Tensor)");
  m.def("attention_amx(int mode) -> bool");
}

TORCH_LIBRARY_IMPL(bertforge, CPU, m) {
  m.impl("varlen_attention_train", varlen_attention_train);
  m.impl("varlen_attention_train_backward", varlen_attention_train_backward);
}

// No tensor argument to dispatch on: the switch is registered for every backend.
TORCH_LIBRARY_IMPL(bertforge, CatchAll, m) { m.impl("attention_amx", attention_amx); }
