// DeBERTa's disentangled self-attention over unpadded sequences, for inference on CPU.
//
// A score adds to BERT's q_i . k_j two terms read through the relative distance i - j: c2p,
// q_i . pk[r] and p2c, pq[r] . k_j, where r = rows[i - j] is the row of the distance table
// (bucketed, see models/deberta_v2.py) and pk, pq are that table projected by the layer's key and
// query matrices. In PyTorch ops each term is a batched matmul of every query against every table
// row ([B, nh, T, 2k]), then a gather of the T x T entries wanted, then an add: at 512 tokens the
// gathers, adds, mask and softmax over [B, nh, T, T] took half of a DeBERTa-v3-base forward.
// Here each (head, sequence) pair is one task, and nothing [T, T] leaves it:
//   1. the head's keys are transposed (kT), its values copied together, its queries scaled, and
//      the head's slice of pk and pq transposed (pkT, pqT) once per head a thread takes;
//   2. p2c: for each group of QB keys, their products with only the table rows some query
//      reaches from them (a band about L wide, not all 2k rows), into Pt [L, R];
//   3. for each group of QB queries: scores against every key block, c2p against only the rows
//      these queries reach, then per entry the two terms picked by rows[i - j] and added (a
//      scalar pass: the only gather left, reading two rows that sit in L1), softmax, p v.
// The scale (1/sqrt(d (1 + terms)) in DeBERTa) multiplies q and pq as they are read.
// q, k, v and the output are float32 or bfloat16 (under bf16 autocast); arithmetic is float32.
// Each task's arithmetic does not depend on how tasks are split over threads, so outputs are the
// same bit for bit at any thread count.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention_blocks.h"
#include "simd.h"

namespace {

using namespace bertforge_simd;
using namespace bertforge_attention;

// Rows n of a [*, stride] matrix of T, columns [col, col + d), as float32 times `scale`:
// transposed into dst [d, ld] (dst[c * ld + n]) when `transpose`, else into dst [n, d].
template <typename T>
void gather_head(const T* src, int64_t stride, int64_t col, int64_t n, int64_t d, float scale, bool transpose,
                 float* dst, int64_t ld) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < d; ++c) {
      const float x = static_cast<float>(src[j * stride + col + c]) * scale;
      if (transpose)
        dst[c * ld + j] = x;
      else
        dst[j * d + c] = x;
    }
}

struct Table {
  const void* pos_key = nullptr;    // [R, H] or null: c2p off
  const void* pos_query = nullptr;  // [R, H] or null: p2c off
  int64_t R = 0;
  const int64_t* rows = nullptr;  // [2 * span - 1]: the table row of distance i - j at (i - j) + span - 1
  int64_t span = 0;
};

// What one thread keeps between tasks: its buffers, and which head's table slice is loaded.
struct Scratch {
  std::vector<float> kT, vc, qs, kr, pkT, pqT, Pt, C, p;
  int64_t head = -1;
};

template <int D, typename T>
void attend(const T* q, const T* k, const T* v, int64_t qs_, int64_t ks_, int64_t vs_, T* out, int64_t base,
            int64_t L, int64_t h, int64_t H, int64_t d, float scale, const Table& table, Scratch& s) {
  const int64_t Lp = (L + W - 1) / W * W, ld = Lp + W, blocks = Lp / W;
  const int64_t Rp = (table.R + W - 1) / W * W, ldR = Rp + W;
  const bool c2p = table.pos_key != nullptr, p2c = table.pos_query != nullptr;
  // 1. This head's keys (transposed), values, scaled queries; the table slice once per head.
  gather_head(k + base * ks_, ks_, h * d, L, d, 1.0f, true, s.kT.data(), ld);
  for (int64_t c = 0; c < d; ++c) std::fill(s.kT.data() + c * ld + L, s.kT.data() + c * ld + Lp, 0.0f);
  gather_head(v + base * vs_, vs_, h * d, L, d, 1.0f, false, s.vc.data(), 0);
  gather_head(q + base * qs_, qs_, h * d, L, d, scale, false, s.qs.data(), 0);
  if (s.head != h) {
    std::fill(s.pkT.begin(), s.pkT.end(), 0.0f);  // the columns past R stay 0
    std::fill(s.pqT.begin(), s.pqT.end(), 0.0f);
    if (c2p) gather_head(static_cast<const T*>(table.pos_key), H, h * d, table.R, d, 1.0f, true, s.pkT.data(), ldR);
    if (p2c) gather_head(static_cast<const T*>(table.pos_query), H, h * d, table.R, d, scale, true, s.pqT.data(), ldR);
    s.head = h;
  }
  const int64_t* rows = table.rows + (table.span - 1);  // rows[delta] for delta in (-span, span)
  // 2. p2c: key j meets the rows of distances i - j, i in [0, L): rows[-j] .. rows[L - 1 - j]
  //    (the rows are nondecreasing in the distance, as the buckets are).
  if (p2c) {
    gather_head(k + base * ks_, ks_, h * d, L, d, 1.0f, false, s.kr.data(), 0);
    for (int64_t j0 = 0; j0 < L; j0 += QB) {
      const int n = static_cast<int>(std::min<int64_t>(QB, L - j0));
      const float* a[QB];
      for (int r = 0; r < QB; ++r) a[r] = s.kr.data() + std::min<int64_t>(j0 + r, L - 1) * d;
      const int64_t lo = rows[-(j0 + n - 1)], hi = rows[L - 1 - j0];
      // A short last group repeats its last key; the rows past it are scratch (Pt has QB spare rows).
      block_products<D>(a, s.pqT.data(), ldR, lo / W, hi / W + 1, d, s.Pt.data() + j0 * ldR, ldR);
    }
  }
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const vi live = lane < static_cast<int32_t>(L - (blocks - 1) * W);
  const vf neg_inf = splat(-std::numeric_limits<float>::infinity());
  float* p = s.p.data();
  float* C = s.C.data();
  for (int64_t i0 = 0; i0 < L; i0 += QB) {
    const int n = static_cast<int>(std::min<int64_t>(QB, L - i0));
    const float* a[QB];
    for (int r = 0; r < QB; ++r) a[r] = s.qs.data() + std::min<int64_t>(i0 + r, L - 1) * d;
    // 3. Scores, then c2p for the rows these queries reach: rows[i0 - (L - 1)] .. rows[i0 + n - 1].
    block_products<D>(a, s.kT.data(), ld, 0, blocks, d, p, ld);
    if (c2p) {
      const int64_t lo = rows[i0 - (L - 1)], hi = rows[i0 + n - 1];
      block_products<D>(a, s.pkT.data(), ldR, lo / W, hi / W + 1, d, C, ldR);
    }
    if (c2p || p2c)
      for (int r = 0; r < n; ++r) {
        const int64_t i = i0 + r;
        float* pr = p + r * ld;
        const float* cr = C + r * ldR;
        for (int64_t j = 0; j < L; ++j) {
          const int64_t at = rows[i - j];
          pr[j] += (c2p ? cr[at] : 0.0f) + (p2c ? s.Pt[j * ldR + at] : 0.0f);
        }
      }
    for (int r = 0; r < QB; ++r) {  // the last block's lanes past the sequence's end
      float* last = p + r * ld + (blocks - 1) * W;
      store(last, live ? load(last) : neg_inf);
    }
    float inv[QB];
    softmax_rows(p, ld, blocks, inv);
    weighted_values<D>(s.vc.data(), d, L, p, ld, inv, n, d, out + (base + i0) * H + h * d, H);
  }
}

at::Tensor disentangled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_seqlens, int64_t num_heads,
                                  const std::optional<at::Tensor>& pos_key, const std::optional<at::Tensor>& pos_query,
                                  const at::Tensor& rows, double scale) {
  const auto dtype = q.scalar_type();
  for (const at::Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == dtype && (dtype == at::kFloat || dtype == at::kBFloat16) &&
                    t->dim() == 2 && t->stride(1) == 1 && t->size(0) == q.size(0) && t->size(1) == q.size(1),
                "disentangled_attention: q, k and v must be float32 or bfloat16 CPU matrices [N, H] of one dtype, "
                "rows contiguous");
  const int64_t N = q.size(0), H = q.size(1);
  TORCH_CHECK(num_heads > 0 && H % num_heads == 0, "disentangled_attention: H must split into heads");
  const int64_t d = H / num_heads;
  const at::Tensor cu = cu_seqlens.to(at::kLong).contiguous();
  TORCH_CHECK(cu.dim() == 1 && cu.numel() >= 1, "disentangled_attention: cu_seqlens must run from 0 to N");
  const int64_t S = cu.numel() - 1;
  const int64_t* starts = cu.data_ptr<int64_t>();
  TORCH_CHECK(starts[0] == 0 && starts[S] == N, "disentangled_attention: cu_seqlens must run from 0 to N");
  int64_t max_len = 0;
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK(starts[s + 1] > starts[s], "disentangled_attention: every sequence needs a token");
    max_len = std::max(max_len, starts[s + 1] - starts[s]);
  }
  Table table;
  // The table's projections, contiguous; R is their row count (0 when neither term is on).
  const auto projection = [&](const std::optional<at::Tensor>& given) -> at::Tensor {
    if (!given.has_value()) return at::Tensor();
    at::Tensor kept = given->contiguous();
    TORCH_CHECK(kept.scalar_type() == dtype && kept.dim() == 2 && kept.size(1) == H && kept.size(0) > 0 &&
                    (table.R == 0 || kept.size(0) == table.R),
                "disentangled_attention: pos_key and pos_query must be [R, H] in q's dtype, R alike");
    table.R = kept.size(0);
    return kept;
  };
  const at::Tensor pk = projection(pos_key), pq = projection(pos_query);
  if (pk.defined()) table.pos_key = pk.data_ptr();
  if (pq.defined()) table.pos_query = pq.data_ptr();
  const at::Tensor rows_c = rows.to(at::kLong).contiguous();
  if (table.R > 0) {
    TORCH_CHECK(rows_c.dim() == 1 && rows_c.numel() % 2 == 1 && (rows_c.numel() + 1) / 2 >= max_len,
                "disentangled_attention: rows must hold 2T - 1 entries, T at least the longest sequence");
    table.span = (rows_c.numel() + 1) / 2;
    table.rows = rows_c.data_ptr<int64_t>();
    for (int64_t i = 0; i < rows_c.numel(); ++i)
      TORCH_CHECK(table.rows[i] >= 0 && table.rows[i] < table.R && (i == 0 || table.rows[i] >= table.rows[i - 1]),
                  "disentangled_attention: rows must be table rows in [0, R), nondecreasing in the distance");
  } else {
    // Neither term: plain attention, which never reads rows; point them at a zero of the right length.
    table.span = max_len;
  }
  std::vector<int64_t> zeros;
  if (table.rows == nullptr) {
    zeros.assign(2 * table.span - 1, 0);
    table.rows = zeros.data();
  }
  const int64_t Lp = (max_len + W - 1) / W * W, Rp = (table.R + W - 1) / W * W;
  const int64_t ld = Lp + W, ldR = Rp + W;
  at::Tensor out = at::empty({N, H}, q.options().memory_format(at::MemoryFormat::Contiguous));
  const float factor = static_cast<float>(scale);
  auto run = [&](auto* qd, auto* kd, auto* vd, auto* od) {
    at::parallel_for(0, S * num_heads, 1, [&](int64_t begin, int64_t end) {
      Scratch s;
      s.kT.resize(d * ld);
      s.vc.resize(max_len * d);
      s.qs.resize(max_len * d);
      s.p.resize(QB * ld);
      if (table.pos_key != nullptr) {
        s.pkT.resize(d * ldR);
        s.C.resize(QB * ldR);
      }
      if (table.pos_query != nullptr) {
        s.pqT.resize(d * ldR);
        s.kr.resize(max_len * d);
        s.Pt.resize((max_len + QB) * ldR);
      }
      for (int64_t task = begin; task < end; ++task) {  // head-major: a thread's tasks share heads
        const int64_t h = task / S, seq = task % S, L = starts[seq + 1] - starts[seq];
        const auto go = [&](auto D) {
          attend<decltype(D)::value>(qd, kd, vd, q.stride(0), k.stride(0), v.stride(0), od, starts[seq], L, h, H, d,
                                     factor, table, s);
        };
        if (d == 32)
          go(std::integral_constant<int, 32>{});
        else if (d == 64)
          go(std::integral_constant<int, 64>{});
        else
          go(std::integral_constant<int, 0>{});
      }
    });
  };
  if (dtype == at::kFloat)
    run(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>());
  else
    run(q.data_ptr<c10::BFloat16>(), k.data_ptr<c10::BFloat16>(), v.data_ptr<c10::BFloat16>(),
        out.data_ptr<c10::BFloat16>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bertforge, m) {
  m.def("disentangled_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, int num_heads, Tensor? pos_key, "
        "Tensor? pos_query, Tensor rows, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(bertforge, CPU, m) { m.impl("disentangled_attention", disentangled_attention); }
