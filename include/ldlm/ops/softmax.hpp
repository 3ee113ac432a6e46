// The exponentials of attention's softmax, one row of scores at a time: capped,
// shifted by the row's maximum and exponentiated in place.
//
// A row of scores at T = 1024 is 4 KB, but a tile of them (ops/attention.hpp) is
// larger than L2, so every pass over a row costs a trip to L3. The AVX-512 and AVX2
// kernels make two passes (cap and maximum, then exponential and sum), and skip the
// exponential inside tanh for the lanes where a polynomial is exact enough, which
// with softcap c = 50 is nearly all. The generic kernel (other CPUs, other scalar
// types) is the definition one element at a time. All compute the same function to
// a few ulp of the shifted score, and the tests hold each to the definition in
// double; which one runs depends only on the CPU (and the scalar type), never on
// the row's address or the worker.
//
// The vector kernels are written once, on core/simd.hpp's vector types. Their loops
// over a group of vectors or a polynomial's coefficients carry `#pragma GCC unroll`:
// GCC unrolls them by itself only at -O3, and at -O2 (RelWithDebInfo, and many a
// consumer's build) the vectors would otherwise go through the stack.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "ldlm/core/cpu.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/simd.hpp"
#include "ldlm/core/tensor.hpp"

#if defined(LDLM_HAVE_X86_SIMD)
#define LDLM_HAVE_AVX512_SOFTMAX 1
#endif

namespace ldlm {

namespace detail {

/// The definition, one element at a time (any scalar type, any CPU). Not Eigen's
/// vector expressions: those peel elements up to an aligned address and compute
/// them with the scalar functions, so an element's value would depend on where the
/// row starts.
template <class S>
S exp_shifted_capped_generic(S* scores, Index n, S cap) {
  S max = -std::numeric_limits<S>::infinity();
  for (Index j = 0; j < n; ++j) {
    if (cap > S(0)) scores[j] = std::tanh(scores[j] / cap) * cap;
    max = std::isnan(scores[j]) ? scores[j] : std::max(max, scores[j]);
  }
  S sum = S(0);
  for (Index j = 0; j < n; ++j) sum += scores[j] = std::exp(scores[j] - max);
  return sum;
}

#if defined(LDLM_HAVE_AVX512_SOFTMAX)
LDLM_INTRINSICS_BEGIN
namespace softmax_simd {
using simd::abs;
using simd::any;
using simd::fmadd;
using simd::fnmadd;
using simd::max;
using simd::min;
using simd::not_less;
using simd::round_to_nearest;
using simd::select;
using simd::sign_bit;
using simd::times_pow2;

constexpr float kLog2e = 1.44269504088896341f;
/// e^r for |r| ≤ ln(2)/2, its Taylor polynomial to r^7 (truncation error below 6e-9 relative).
constexpr float kExpTaylor[] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
/// 2^r = e^(r ln 2) for |r| ≤ 1/2, its Taylor polynomial to degree 6: ln(2)^i / i!,
/// i = 6 … 0 (relative error below 1.7e-7, at r = -1/2).
constexpr float kExp2Taylor[] = {1.5403530393381606e-4f,
                                 1.3333558146428443e-3f,
                                 9.6181291076284772e-3f,
                                 5.5504108664821580e-2f,
                                 0.24022650695910071f,
                                 0.69314718055994531f,
                                 1.0f};
/// tanh(y) = y + y · y² · P(y²) for |y| < 0.4: P's coefficients, from the odd Taylor
/// series to y^13 (next term below 5e-9 relative).
constexpr float kTanhSeries[] = {21844.0f / 6081075, -1382.0f / 155925, 62.0f / 2835,
                                 -17.0f / 315,       2.0f / 15,         -1.0f / 3};
/// Below this |y|, tanh's series is exact enough.
constexpr float kTanhSeriesBound = 0.4f;

/// e^x: e^x = 2^k · e^r with k = round(x / ln 2) and |r| ≤ ln(2)/2. ln 2 is split in
/// two so that r is exact. x is clamped to [-104, 89], where e^x is 0 or inf in float
/// anyway; the clamps keep NaN (vmaxps returns its second operand).
template <class V>
LDLM_SIMD_KERNEL V exp(const V& argument) {
  const V x = min(V::set1(89.0f), max(V::set1(-104.0f), argument));
  const V k = round_to_nearest(x * V::set1(kLog2e));
  V r = fnmadd(k, V::set1(0.693359375f), x);
  r = fnmadd(k, V::set1(-2.12194440e-4f), r);
  return times_pow2(simd::horner(r, kExpTaylor), k);
}

/// tanh(y) for the lanes with |y| ≥ 0.4 (or NaN): (1 − e)/(1 + e) with e = e^(−2|y|)
/// ≤ 0.45, so 1 − e cannot cancel; the sign comes back from y.
template <class V>
LDLM_SIMD_KERNEL V tanh_by_exp(const V& y) {
  const V e = exp(abs(y) * V::set1(-2.0f));
  const V one = V::set1(1.0f);
  return ((one - e) / (one + e)) | sign_bit(y);
}

/// tanh, the series where it is exact enough, y + (P(y²) · y²) · y. The exponential is
/// skipped when no lane needs it.
template <class V>
LDLM_SIMD_KERNEL V tanh(const V& y) {
  const V y2 = y * y;
  const V series = fmadd(simd::horner(y2, kTanhSeries) * y2, y, y);
  const auto large = not_less(abs(y), V::set1(kTanhSeriesBound));
  if (!any(large)) return series;
  return select(large, tanh_by_exp(y), series);
}

/// How a kernel computes capped(s) and e^x; the two differ in rounding, by a few ulp.
/// - direct: cap · tanh(s / cap), and exp.
/// - fewer_multiplies: the series written around s, s + s · y² · P(y²) with y = s / cap,
///   so that it rounds once around s and skips the multiply by cap; e^x as 2^(x log2 e)
///   with the power of two added to the exponent field. The AVX2 kernel's form: on a
///   core whose FMA units are half as wide as its vectors, every multiply counts
///   (bench/results/README.md).
enum class Form { direct, fewer_multiplies };

/// capped(s) = cap · tanh(s / cap) in place for a group of vectors, when cap > 0.
template <Form kForm, class V, int G>
LDLM_SIMD_KERNEL void capped(V (&s)[G], float cap) {
  if (!(cap > 0.0f)) return;
  if constexpr (kForm == Form::direct) {
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) s[h] = V::set1(cap) * tanh(s[h] * V::set1(1.0f / cap));
  } else {
    const V inverse_cap = V::set1(1.0f / cap);
    V y[G], y2[G], p[G];
    typename V::Mask large[G];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      y[h] = s[h] * inverse_cap;
      y2[h] = y[h] * y[h];
      large[h] = not_less(abs(y[h]), V::set1(kTanhSeriesBound));
    }
    simd::horner(p, y2, kTanhSeries);
    V series[G];
    auto any_large = large[0];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      series[h] = fmadd(s[h] * y2[h], p[h], s[h]);
      any_large = any_large | large[h];
    }
    if (!any(any_large)) {
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) s[h] = series[h];
      return;
    }
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) s[h] = select(large[h], V::set1(cap) * tanh_by_exp(y[h]), series[h]);
  }
}

/// e^x in place for a group of shifted scores x ≤ 0.
/// fewer_multiplies: 2^z with z = x · log2(e), k = round(z) and r = z − k exact, and k
/// added to 2^r's exponent field. So results below 2^−125 (x < −86.6) become zero
/// rather than subnormal, which a softmax whose largest term is 1 cannot tell. NaN
/// stays NaN. x > 0 would overflow the exponent field: it occurs only in a row with a
/// NaN, whose maximum can miss lanes seen before the NaN, and whose sum is NaN
/// whatever they hold.
template <Form kForm, class V, int G>
LDLM_SIMD_KERNEL void exp_of_shifted(V (&x)[G]) {
  if constexpr (kForm == Form::direct) {
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) x[h] = exp(x[h]);
  } else {
    const V lowest = V::set1(-125.0f);
    V k[G], r[G], p[G];
    typename V::Mask normal[G];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      const V z = x[h] * V::set1(kLog2e);
      normal[h] = not_less(z, lowest);
      const V clamped = max(lowest, z);  // (vmaxps returns its second operand, NaN)
      k[h] = round_to_nearest(clamped);
      r[h] = clamped - k[h];
    }
    simd::horner(p, r, kExp2Taylor);
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) x[h] = zero_unless(normal[h], simd::add_to_exponent(p[h], k[h]));
  }
}

/// exp_shifted_capped on vectors V, 16 scores at a time whatever V's width: lane l of
/// the maximum and of the sum sees the scores j ≡ l (mod 16), in the same order on
/// every target, and the lanes are combined from lane 0 up.
template <Form kForm, class V>
LDLM_SIMD_KERNEL float exp_shifted_capped(float* scores, Index n, float cap) {
  constexpr int G = 16 / V::kLanes, L = V::kLanes;
  const Index full = n / 16 * 16, rest = n - full;
  typename V::Mask tail[G];
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) tail[h] = V::first(rest - h * L);

  V max[G];
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) max[h] = V::set1(-INFINITY);
  for (Index j = 0; j < full; j += 16) {
    V s[G];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) s[h] = V::load(scores + j + h * L);
    capped<kForm>(s, cap);
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      s[h].store(scores + j + h * L);
      max[h] = softmax_simd::max(max[h], s[h]);
    }
  }
  if (rest) {
    V s[G];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) s[h] = V::load(tail[h], scores + full + h * L);
    capped<kForm>(s, cap);
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      s[h].store(tail[h], scores + full + h * L);
      max[h] = select(tail[h], softmax_simd::max(max[h], s[h]), max[h]);
    }
  }
  alignas(64) float lanes[16];
  simd::store_lanes(max, lanes);
  float row_max = lanes[0];
  for (int l = 1; l < 16; ++l) row_max = std::max(row_max, lanes[l]);
  const V shift = V::set1(row_max);

  V sum[G];
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) sum[h] = V::set1(0.0f);
  for (Index j = 0; j < full; j += 16) {
    V e[G];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) e[h] = V::load(scores + j + h * L) - shift;
    exp_of_shifted<kForm>(e);
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      e[h].store(scores + j + h * L);
      sum[h] = sum[h] + e[h];
    }
  }
  if (rest) {
    V e[G];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) e[h] = V::load(tail[h], scores + full + h * L) - shift;
    exp_of_shifted<kForm>(e);
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      e[h].store(tail[h], scores + full + h * L);
      sum[h] = select(tail[h], sum[h] + e[h], sum[h]);
    }
  }
  simd::store_lanes(sum, lanes);
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  return total;
}
}  // namespace softmax_simd

__attribute__((target("avx512f,avx512dq"))) inline float exp_shifted_capped_avx512(float* scores, Index n, float cap) {
  return softmax_simd::exp_shifted_capped<softmax_simd::Form::direct, simd::F32x16>(scores, n, cap);
}

__attribute__((target("avx2,fma"))) inline float exp_shifted_capped_avx2(float* scores, Index n, float cap) {
  return softmax_simd::exp_shifted_capped<softmax_simd::Form::fewer_multiplies, simd::F32x8>(scores, n, cap);
}

/// The softmax row of bf16 attention on AMX (ops/attention.hpp), with the scale of
/// QKᵀ folded in (AMX's products cannot scale): e_j = exp(capped(scale · s_j) − m)
/// and their sum; then e_j / Σ rounded to bf16 by AVX512_BF16's instruction, into
/// probabilities[0, visible), and zeros up to `padded` (padded ≥ visible). Also the
/// softmax of bf16 attention on oneDNN's kernels (scale 1: their product scales), so
/// both bf16 paths round the same probabilities.
/// - The shift m only keeps the exponentials in range, and cancels in e_j / Σ. With
///   a cap c ≤ 64 every capped score lies in [−c, c], so m = 0: e^(±c) is a normal
///   float (e^±64 is 2^±92.3) and 2^24 of them sum to at most 2^117. That saves the
///   pass that finds the maximum, which reads the row from L2 (the tile of scores is
///   larger than L1).
/// - Otherwise (no cap, or a larger one) m = capped(scale · max), the largest capped
///   score up to the rounding of tanh: a positive scale and the cap are increasing.
/// - The exponential runs in base 2 with cap · log2(e) folded into one FMA, one
///   rounding error fewer than exp's: the result's relative error is a few ulp of the
///   exponent, which is at most 2 · cap · log2(e) with a cap and |scale · s · log2(e)|
///   without one, as exp_shifted_capped's is of its argument; the probabilities keep
///   8 bits.
/// - The instruction rounds to nearest even as float_to_bf16 does, but flushes
///   subnormal results (below 1.2e-38) to zero, which no product can tell.
__attribute__((target("avx512f,avx512dq,avx512bw,avx512bf16"))) inline void softmax_row_to_bf16_avx512(
    float* scores, Index visible, Index padded, float scale, float cap, bf16* probabilities) {
  using V = simd::F32x16;
  using namespace softmax_simd;
  if (visible < 1 || padded < visible)
    throw InvalidArgument("softmax_row_to_bf16: needs 1 <= visible <= padded; got visible " +
                          std::to_string(visible) + ", padded " + std::to_string(padded));
  constexpr float kLargestUnshiftedCap = 64.0f;
  constexpr Index kLongestUnshiftedRow = Index{1} << 24;
  const Index full = visible / 16 * 16;
  const V::Mask tail = V::first(visible - full);
  const bool is_capped = cap > 0.0f;
  alignas(64) float lanes[16];
  float shift = 0.0f;  // m, in the units of the capped scores
  if (!(is_capped && cap <= kLargestUnshiftedCap && visible <= kLongestUnshiftedRow)) {
    V row_max[1] = {V::set1(-INFINITY)};
    for (Index j = 0; j < full; j += 16) row_max[0] = softmax_simd::max(row_max[0], V::load(scores + j));
    if (any(tail)) row_max[0] = select(tail, softmax_simd::max(row_max[0], V::load(tail, scores + full)), row_max[0]);
    simd::store_lanes(row_max, lanes);
    float m = lanes[0];
    for (int l = 1; l < 16; ++l) m = std::max(m, lanes[l]);
    // (scale = 1 multiplies nothing: a multiply by 1 would flush a subnormal maximum
    // under a caller's flush-to-zero mode.)
    V m_capped[1] = {V::set1(scale != 1.0f ? m * scale : m)};
    capped<Form::direct>(m_capped, cap);
    simd::store_lanes(m_capped, lanes);
    shift = lanes[0];
  }

  // z = log2(e) · (capped(scale · s) − m), as tanh(s · scale / cap) times cap · log2(e),
  // or s times scale · log2(e), plus one constant; then 2^z = 2^k · 2^(z − k).
  const V inner = V::set1(is_capped ? scale / cap : scale * kLog2e);
  const V outer = V::set1(is_capped ? cap * kLog2e : 1.0f);
  const V offset = V::set1(-shift * kLog2e);
  const V lowest = V::set1(-150.0f);  // 2^-150 is 0 in float; keeps -inf from making NaN
  auto exp_of = [&](V s) __attribute__((target("avx512f,avx512dq"))) {
    const V x = s * inner;
    const V z = softmax_simd::max(lowest, fmadd(is_capped ? softmax_simd::tanh(x) : x, outer, offset));  // NaN stays
    const V k = round_to_nearest(z);
    return times_pow2(simd::horner(z - k, kExp2Taylor), k);
  };
  V sum = V::set1(0.0f);
  for (Index j = 0; j < full; j += 16) {
    const V e = exp_of(V::load(scores + j));
    e.store(scores + j);
    sum = sum + e;
  }
  if (any(tail)) {
    const V e = exp_of(V::load(tail, scores + full));
    e.store(tail, scores + full);
    sum = select(tail, sum + e, sum);
  }
  const V inverse = V::set1(1.0f / simd::sum_of_lanes(sum));
  auto store_pair = [&](Index j, V a, V b, __mmask32 stored) __attribute__((target("avx512f,avx512bw,avx512bf16"))) {
    _mm512_mask_storeu_epi16(probabilities + j, stored, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b.v, a.v)));
  };
  constexpr __mmask32 kAll = ~__mmask32{0};
  Index j = 0;
  for (; j + 32 <= visible; j += 32)
    store_pair(j, V::load(scores + j) * inverse, V::load(scores + j + 16) * inverse, kAll);
  // The last visible values and the zeros after them, up to `padded`. The product is
  // masked as well as the load: a NaN row's inverse would turn a zero into NaN.
  for (; j < padded; j += 32) {
    const V::Mask low = V::first(visible - j), high = V::first(visible - j - 16);
    const Index left = padded - j;
    store_pair(j, zero_unless(low, V::load(low, scores + j) * inverse),
               zero_unless(high, V::load(high, scores + j + 16) * inverse),
               left >= 32 ? kAll : static_cast<__mmask32>((__mmask32{1} << left) - 1));
  }
}
LDLM_INTRINSICS_END
#endif

}  // namespace detail

/// scores[j] ← exp(capped(scores[j]) − max_i capped(scores[i])) for j in [0, n), in
/// place, with capped(s) = cap · tanh(s / cap) when cap > 0 and s otherwise; returns
/// the sum of the new values (the softmax's denominator). n ≥ 1.
template <class S>
S exp_shifted_capped(S* scores, Index n, S cap) {
#if defined(LDLM_HAVE_AVX512_SOFTMAX)
  if constexpr (std::is_same_v<S, float>) {
    if (cpu_features().avx512f && cpu_features().avx512dq) return detail::exp_shifted_capped_avx512(scores, n, cap);
    if (cpu_features().avx2 && cpu_features().fma) return detail::exp_shifted_capped_avx2(scores, n, cap);
  }
#endif
  return detail::exp_shifted_capped_generic(scores, n, cap);
}

}  // namespace ldlm
