// The exponentials of attention's softmax, one row of scores at a time: capped,
// shifted by the row's maximum and exponentiated in place.
//
// A row of scores at T = 1024 is 4 KB, but a tile of them (ops/attention.hpp) is
// larger than L2, so every pass over a row costs a trip to L3. The AVX-512 kernel
// makes two passes (cap and maximum, then exponential and sum) where the generic
// Eigen expressions make four, and skips the exponential inside tanh for the lanes
// where a polynomial is exact enough, which with softcap c = 50 is nearly all.
// Both compute the same function to about 2 ulp; which one runs depends only on
// the CPU (and the scalar type), never on the row's address or the worker.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ldlm/core/cpu.hpp"
#include "ldlm/core/tensor.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LDLM_HAVE_AVX512_SOFTMAX 1
#endif

namespace ldlm {

namespace detail {

/// The definition, in Eigen's vector expressions (any scalar type, any CPU).
template <class S>
S exp_shifted_capped_generic(S* scores, Index n, S cap) {
  Eigen::Map<Eigen::Array<S, 1, Eigen::Dynamic>> row(scores, n);
  if (cap > S(0)) row = (row / cap).tanh() * cap;
  row = (row - row.maxCoeff()).exp();
  return row.sum();
}

#if defined(LDLM_HAVE_AVX512_SOFTMAX)
/// e^x in 16 lanes: e^x = 2^k · e^r with k = round(x / ln 2) and |r| ≤ ln(2)/2, e^r
/// by its Taylor polynomial to r^7 (truncation error below 6e-9 relative). ln 2 is
/// split in two so that r is exact. x is clamped to [-104, 89], where e^x is 0 or
/// inf in float anyway; the clamps keep NaN (vmaxps returns its second operand).
__attribute__((target("avx512f"))) inline __m512 exp_avx512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);  // exact scaling by 2^k, with underflow to 0 and overflow to inf
}

/// tanh in 16 lanes. |y| < 0.4: the odd Taylor series to y^13 (next term below
/// 2e-9 relative). Otherwise (1 − e)/(1 + e) with e = e^(−2|y|) ≤ 0.45, so 1 − e
/// cannot cancel; the sign comes back from y. The exponential is skipped when no
/// lane needs it.
__attribute__((target("avx512f"))) inline __m512 tanh_avx512(__m512 y) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 a = _mm512_and_ps(y, abs_mask);
  const __m512 y2 = _mm512_mul_ps(y, y);
  __m512 p = _mm512_set1_ps(21844.0f / 6081075);
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(-1382.0f / 155925));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(62.0f / 2835));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(-17.0f / 315));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(2.0f / 15));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(-1.0f / 3));
  p = _mm512_mul_ps(p, y2);
  const __m512 series = _mm512_fmadd_ps(p, y, y);
  const __mmask16 large = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.4f), _CMP_NLT_UQ);  // NaN counts as large
  if (large == 0) return series;
  const __m512 e = exp_avx512(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 magnitude = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512 sign = _mm512_andnot_ps(abs_mask, y);
  return _mm512_mask_blend_ps(large, series, _mm512_or_ps(magnitude, sign));
}

/// cap · tanh(s / cap) when cap > 0, else s. (A lambda would not inherit the target.)
__attribute__((target("avx512f"))) inline __m512 capped_avx512(__m512 s, float cap) {
  if (!(cap > 0.0f)) return s;
  return _mm512_mul_ps(_mm512_set1_ps(cap), tanh_avx512(_mm512_mul_ps(s, _mm512_set1_ps(1.0f / cap))));
}

__attribute__((target("avx512f"))) inline float exp_shifted_capped_avx512(float* scores, Index n, float cap) {
  const Index full = n / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - full)) - 1u);

  __m512 max = _mm512_set1_ps(-INFINITY);
  for (Index j = 0; j < full; j += 16) {
    const __m512 s = capped_avx512(_mm512_loadu_ps(scores + j), cap);
    _mm512_storeu_ps(scores + j, s);
    max = _mm512_max_ps(max, s);
  }
  if (tail) {
    const __m512 s = capped_avx512(_mm512_maskz_loadu_ps(tail, scores + full), cap);
    _mm512_mask_storeu_ps(scores + full, tail, s);
    max = _mm512_mask_max_ps(max, tail, max, s);
  }
  alignas(64) float lanes[16];  // (GCC 12 warns inside _mm512_reduce_*_ps)
  _mm512_store_ps(lanes, max);
  float row_max = lanes[0];
  for (int l = 1; l < 16; ++l) row_max = std::max(row_max, lanes[l]);
  const __m512 shift = _mm512_set1_ps(row_max);

  __m512 sum = _mm512_setzero_ps();
  for (Index j = 0; j < full; j += 16) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(scores + j), shift));
    _mm512_storeu_ps(scores + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (tail) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, scores + full), shift));
    _mm512_mask_storeu_ps(scores + full, tail, e);
    sum = _mm512_mask_add_ps(sum, tail, sum, e);
  }
  _mm512_store_ps(lanes, sum);
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  return total;
}
#endif

}  // namespace detail

/// scores[j] ← exp(capped(scores[j]) − max_i capped(scores[i])) for j in [0, n), in
/// place, with capped(s) = cap · tanh(s / cap) when cap > 0 and s otherwise; returns
/// the sum of the new values (the softmax's denominator). n ≥ 1.
template <class S>
S exp_shifted_capped(S* scores, Index n, S cap) {
#if defined(LDLM_HAVE_AVX512_SOFTMAX)
  if constexpr (std::is_same_v<S, float>)
    if (cpu_features().avx512f) return detail::exp_shifted_capped_avx512(scores, n, cap);
#endif
  return detail::exp_shifted_capped_generic(scores, n, cap);
}

}  // namespace ldlm
