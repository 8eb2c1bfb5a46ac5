// What bertforge's native kernels share: 16-lane vectors, bfloat16 loads and stores, softmax's
// exponential, horizontal reductions, and the dropout hash.
//
// Vectors are GCC/Clang vector extensions, so one source compiles for AVX-512, AVX2 or SSE; the
// loader (kernels/__init__.py) picks the flags. Everything here is inline: each kernel file
// includes it, and the library's build name carries a hash of every file beside it, so a change
// here rebuilds them all.

#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

namespace bertforge_simd {

constexpr int W = 16;  // lanes per vector
typedef float vf __attribute__((vector_size(W * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(W * sizeof(int32_t))));
typedef uint32_t vu __attribute__((vector_size(W * sizeof(uint32_t))));
typedef uint16_t vh __attribute__((vector_size(W * sizeof(uint16_t))));

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
inline vf splat(float x) { return vf{} + x; }
inline vu lanes() { return vu{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; }

// W elements of T to and from float32: float as is; bfloat16 widened exactly, and narrowed by
// rounding to nearest, ties to even, as torch's own casts do.
template <typename T> struct Io;

// Each lane's bfloat16 bits (in the low half): rounded to nearest, ties to even, as torch's own
// casts round, and c10's quiet NaN for a NaN.
inline vu bf16_bits(vf v) {
  vu bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const vu rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const vi nan = v != v;
  return nan ? vu{} + 0x7FC0u : rounded;
}

template <> struct Io<float> {
  static vf load(const float* p) { return bertforge_simd::load(p); }
  static void store(float* p, vf v) { bertforge_simd::store(p, v); }
};

template <> struct Io<c10::BFloat16> {
  static vf load(const c10::BFloat16* p) {
    vh raw;
    std::memcpy(&raw, p, sizeof(raw));
    vu bits = __builtin_convertvector(raw, vu) << 16;  // a bfloat16 is a float32's top half
    vf v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  static void store(c10::BFloat16* p, vf v) {
    vh raw = __builtin_convertvector(bf16_bits(v), vh);
    std::memcpy(p, &raw, sizeof(raw));
  }
};

// e^x for x <= 0, the only range softmax needs once the max is subtracted; 0 below e^-64.
// Why the cut: a probability under e^-64 (1.6e-28) of the largest cannot change a float32
// output, but its products with v are denormals, which real attention rows are full of and
// which took ~30% of the attention kernel's time on BERT's attention (AMD EPYC) before the cut.
// Cephes' expf: range reduction by ln 2, a degree-6 polynomial, about 1e-7 relative error.
inline vf exp_nonpositive(vf x) {
  const vi dropped = x < -64.0f;
  x = dropped ? splat(-64.0f) : x;
  // n = round(x / ln 2); x <= 0, so truncating x / ln 2 - 0.5 toward zero rounds to nearest.
  vi n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi);
  vf nf = __builtin_convertvector(n, vf);
  vf r = x - nf * 0.693359375f + nf * 2.12194440e-4f;  // x - n ln 2, ln 2 split in two for precision
  vf y = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r
          + 1.6666665459e-1f) * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  y *= (vf)((n + 127) << 23);  // times 2^n, built in the exponent bits
  return dropped ? vf{} : y;
}

// Horizontal max and sum: fold the vector in halves four times.
inline float hmax(vf v) {
  vf t = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v = v > t ? v : t;
  t = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v = v > t ? v : t;
  t = __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v = v > t ? v : t;
  t = __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  v = v > t ? v : t;
  return v[0];
}

inline float hsum(vf v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

// Mean and 1 / sqrt(variance + eps) of a row of H floats, in two passes (the mean first, so the
// variance sums the squares of differences, not of the raw values): what each LayerNorm kernel
// normalises a row by (layer_norm.cpp, residual_norm.cpp).
inline void row_moments(const float* x, int64_t H, float eps, float* mean, float* rstd) {
  const int64_t full = H / W * W;
  vf acc = {};
  for (int64_t c = 0; c < full; c += W) acc += load(x + c);
  float sum = hsum(acc);
  for (int64_t c = full; c < H; ++c) sum += x[c];
  const float m = sum / static_cast<float>(H);
  acc = vf{};
  for (int64_t c = 0; c < full; c += W) {
    const vf t = load(x + c) - m;
    acc += t * t;
  }
  float squares = hsum(acc);
  for (int64_t c = full; c < H; ++c) squares += (x[c] - m) * (x[c] - m);
  *mean = m;
  *rstd = 1.0f / __builtin_sqrtf(squares / static_cast<float>(H) + eps);
}

// The dropout hash (dropout.cpp says why this one): two rounds of a 32-bit xor-shift-multiply
// mixer keyed by the halves of a 64-bit key. Element `index` is kept when the hash is at least
// `threshold` = round(p * 2^32); kernels/dropout.py computes the same bits in torch ops.
constexpr uint32_t kSpread = 0x9E3779B1u;  // odd, ~2^32 / golden ratio: spreads consecutive indices

inline vu mix(vu h) {
  h ^= h >> 16;
  h *= 0x21f0aaadu;
  h ^= h >> 15;
  h *= 0x735a2d97u;
  h ^= h >> 15;
  return h;
}

// Which of the W elements `start`, `start` + 1, ... the key keeps (all lanes set where kept).
inline vi kept(uint32_t start, uint32_t k0, uint32_t k1, uint32_t threshold) {
  const vu index = lanes() + start;
  return mix(mix(index * kSpread + k0) ^ k1) >= threshold;
}

}  // namespace bertforge_simd
