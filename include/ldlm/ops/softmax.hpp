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
// The kernels' helpers are always inlined, and their loops over a pair of vectors
// or a polynomial's coefficients carry `#pragma GCC unroll`: GCC unrolls them by
// itself only at -O3. At -O2 (RelWithDebInfo, and many a consumer's build) the
// vectors went through the stack and a row took 1.55x as long (AMD EPYC Zen 1).
// An always-inline helper can only be called from a function whose target has all
// of the helper's features: anything narrower is a compile error, not a slow call.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "ldlm/core/cpu.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LDLM_HAVE_AVX512_SOFTMAX 1
#endif

namespace ldlm {

namespace detail {

/// The definition, one element at a time (any scalar type, any CPU). Not Eigen's
/// vector expressions: those peel elements up to an aligned address and compute
/// them with the scalar functions, so an element's value would depend on where the
/// row starts (seen with -mavx2 on an AMD EPYC Zen 1).
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
/// e^x in 16 lanes: e^x = 2^k · e^r with k = round(x / ln 2) and |r| ≤ ln(2)/2, e^r
/// by its Taylor polynomial to r^7 (truncation error below 6e-9 relative). ln 2 is
/// split in two so that r is exact. x is clamped to [-104, 89], where e^x is 0 or
/// inf in float anyway; the clamps keep NaN (vmaxps returns its second operand).
__attribute__((target("avx512f"), always_inline)) inline __m512 exp_avx512(__m512 x) {
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
/// 5e-9 relative). Otherwise (1 − e)/(1 + e) with e = e^(−2|y|) ≤ 0.45, so 1 − e
/// cannot cancel; the sign comes back from y. The exponential is skipped when no
/// lane needs it.
__attribute__((target("avx512f,avx512dq"), always_inline)) inline __m512 tanh_avx512(__m512 y) {
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
__attribute__((target("avx512f,avx512dq"), always_inline)) inline __m512 capped_avx512(__m512 s, float cap) {
  if (!(cap > 0.0f)) return s;
  return _mm512_mul_ps(_mm512_set1_ps(cap), tanh_avx512(_mm512_mul_ps(s, _mm512_set1_ps(1.0f / cap))));
}

__attribute__((target("avx512f,avx512dq"))) inline float exp_shifted_capped_avx512(float* scores, Index n, float cap) {
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

/// e^x in 8 lanes, exp_avx512's operations lane for lane, for tanh's exponential
/// form. AVX2 has no vscalefps: this scales by 2^k as 2^⌊k/2⌋ · 2^(k−⌊k/2⌋), two
/// normal powers of two for every k in [−150, 128], so only the last multiply
/// rounds, as vscalefps does (to a subnormal, zero or infinity at the ends).
__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ki = _mm256_cvtps_epi32(k);
  const __m256i k_low = _mm256_srai_epi32(ki, 1), k_high = _mm256_sub_epi32(ki, k_low);
  auto power_of_two = [](__m256i e) __attribute__((target("avx2"))) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  };
  __m256 e = _mm256_mul_ps(_mm256_mul_ps(p, power_of_two(k_low)), power_of_two(k_high));
  // Rounded here, as vscalefps's result is: GCC would otherwise fuse this multiply
  // into a caller's add (tanh's 1 ± e) as an FMA.
  __asm__("" : "+x"(e));
  return e;
}

// The AVX2 kernel below is not the AVX-512 one lane for lane. On a core whose FMA
// units are 128 bits wide (AMD Zen 1), where every 256-bit multiply takes both
// halves of a unit, it spends fewer multiplies and keeps two vectors in flight at
// every step, which took its time from 0.55 to 0.39 ms per 256 rows of 1024 scores
// (AMD EPYC Zen 1). The function is the same to a few ulp of the argument; both are
// held to the definition in double by the tests.

/// capped(s) in place for 16 scores, as two vectors of 8: the odd series of
/// cap · tanh(s / cap) to (s / cap)^13 written as s + s · y² · P(y²), y = s / cap
/// (next term below 5e-9 relative for |y| < 0.4), so the result rounds once
/// around s. When any lane has |y| ≥ 0.4 (or is NaN), those lanes take
/// cap · (1 − e)/(1 + e) with e = e^(−2|y|) ≤ 0.45 and the sign of y.
__attribute__((target("avx2,fma"), always_inline)) inline void capped_avx2(__m256 (&s)[2], float cap) {
  if (!(cap > 0.0f)) return;
  const __m256 inverse_cap = _mm256_set1_ps(1.0f / cap);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 y[2], y2[2], p[2], large[2];
#pragma GCC unroll 8
  for (int h = 0; h < 2; ++h) {
    y[h] = _mm256_mul_ps(s[h], inverse_cap);
    y2[h] = _mm256_mul_ps(y[h], y[h]);
    large[h] = _mm256_cmp_ps(_mm256_and_ps(y[h], abs_mask), _mm256_set1_ps(0.4f), _CMP_NLT_UQ);
    p[h] = _mm256_set1_ps(21844.0f / 6081075);
  }
#pragma GCC unroll 8
  for (float c : {-1382.0f / 155925, 62.0f / 2835, -17.0f / 315, 2.0f / 15, -1.0f / 3})
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) p[h] = _mm256_fmadd_ps(p[h], y2[h], _mm256_set1_ps(c));
  __m256 series[2];
#pragma GCC unroll 8
  for (int h = 0; h < 2; ++h) series[h] = _mm256_fmadd_ps(_mm256_mul_ps(s[h], y2[h]), p[h], s[h]);
  if (_mm256_movemask_ps(_mm256_or_ps(large[0], large[1])) == 0) {
    s[0] = series[0], s[1] = series[1];
    return;
  }
  const __m256 one = _mm256_set1_ps(1.0f);
#pragma GCC unroll 8
  for (int h = 0; h < 2; ++h) {
    const __m256 e = exp_avx2(_mm256_mul_ps(_mm256_and_ps(y[h], abs_mask), _mm256_set1_ps(-2.0f)));
    const __m256 magnitude = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    const __m256 tanh = _mm256_or_ps(magnitude, _mm256_andnot_ps(abs_mask, y[h]));
    s[h] = _mm256_blendv_ps(series[h], _mm256_mul_ps(_mm256_set1_ps(cap), tanh), large[h]);
  }
}

/// e^x in place for 16 shifted scores x ≤ 0, as two vectors of 8: 2^z with
/// z = x · log2(e), k = round(z) and r = z − k exact; 2^r by its Taylor polynomial to
/// degree 6 (relative error below 1.7e-7), and k added to its exponent field. So
/// results below 2^−125 (x < −86.6) become zero rather than subnormal, which a
/// softmax whose largest term is 1 cannot tell. NaN stays NaN. x > 0 would
/// overflow the exponent field: it occurs only in a row with a NaN, whose maximum
/// can miss lanes seen before the NaN, and whose sum is NaN whatever they hold.
__attribute__((target("avx2,fma"), always_inline)) inline void exp_of_shifted_avx2(__m256 (&x)[2]) {
  const __m256 lowest = _mm256_set1_ps(-125.0f);
  __m256 k[2], r[2], p[2], normal[2];
#pragma GCC unroll 8
  for (int h = 0; h < 2; ++h) {
    const __m256 z = _mm256_mul_ps(x[h], _mm256_set1_ps(1.44269504088896341f));
    normal[h] = _mm256_cmp_ps(z, lowest, _CMP_NLT_UQ);
    const __m256 clamped = _mm256_max_ps(lowest, z);  // (vmaxps returns its second operand, NaN)
    k[h] = _mm256_round_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r[h] = _mm256_sub_ps(clamped, k[h]);
    p[h] = _mm256_set1_ps(1.5403530393381606e-4f);  // ln(2)^6 / 6!
  }
#pragma GCC unroll 8
  for (float c : {1.3333558146428443e-3f, 9.6181291076284772e-3f, 5.5504108664821580e-2f, 0.24022650695910071f,
                  0.69314718055994531f, 1.0f})  // ln(2)^i / i!, i = 5 … 0
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) p[h] = _mm256_fmadd_ps(p[h], r[h], _mm256_set1_ps(c));
#pragma GCC unroll 8
  for (int h = 0; h < 2; ++h) {
    const __m256i exponent = _mm256_slli_epi32(_mm256_cvtps_epi32(k[h]), 23);
    x[h] = _mm256_and_ps(normal[h], _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p[h]), exponent)));
  }
}

__attribute__((target("avx2,fma"))) inline float exp_shifted_capped_avx2(float* scores, Index n, float cap) {
  const Index full = n / 16 * 16;
  const Index rest = n - full;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i tail[2] = {_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(rest)), lane),
                           _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(rest) - 8), lane)};

  __m256 max[2] = {_mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY)};
  for (Index j = 0; j < full; j += 16) {
    __m256 s[2] = {_mm256_loadu_ps(scores + j), _mm256_loadu_ps(scores + j + 8)};
    capped_avx2(s, cap);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      _mm256_storeu_ps(scores + j + 8 * h, s[h]);
      max[h] = _mm256_max_ps(max[h], s[h]);
    }
  }
  if (rest) {
    __m256 s[2] = {_mm256_maskload_ps(scores + full, tail[0]), _mm256_maskload_ps(scores + full + 8, tail[1])};
    capped_avx2(s, cap);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      _mm256_maskstore_ps(scores + full + 8 * h, tail[h], s[h]);
      max[h] = _mm256_blendv_ps(max[h], _mm256_max_ps(max[h], s[h]), _mm256_castsi256_ps(tail[h]));
    }
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, max[0]);
  _mm256_store_ps(lanes + 8, max[1]);
  float row_max = lanes[0];
  for (int l = 1; l < 16; ++l) row_max = std::max(row_max, lanes[l]);
  const __m256 shift = _mm256_set1_ps(row_max);

  __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (Index j = 0; j < full; j += 16) {
    __m256 e[2] = {_mm256_sub_ps(_mm256_loadu_ps(scores + j), shift),
                   _mm256_sub_ps(_mm256_loadu_ps(scores + j + 8), shift)};
    exp_of_shifted_avx2(e);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      _mm256_storeu_ps(scores + j + 8 * h, e[h]);
      sum[h] = _mm256_add_ps(sum[h], e[h]);
    }
  }
  if (rest) {
    __m256 e[2] = {_mm256_sub_ps(_mm256_maskload_ps(scores + full, tail[0]), shift),
                   _mm256_sub_ps(_mm256_maskload_ps(scores + full + 8, tail[1]), shift)};
    exp_of_shifted_avx2(e);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      _mm256_maskstore_ps(scores + full + 8 * h, tail[h], e[h]);
      sum[h] = _mm256_blendv_ps(sum[h], _mm256_add_ps(sum[h], e[h]), _mm256_castsi256_ps(tail[h]));
    }
  }
  _mm256_store_ps(lanes, sum[0]);
  _mm256_store_ps(lanes + 8, sum[1]);
  float total = 0.0f;
  for (float l : lanes) total += l;
  return total;
}

/// 2^z in 16 lanes for z ≥ -150 (callers clamp): 2^k · 2^r with k = round(z) and
/// r = z − k in [-1/2, 1/2] exactly; 2^r = e^(r ln 2) by its Taylor polynomial to
/// degree 6 (relative error below 1.7e-7, at r = -1/2). One rounding error fewer than
/// exp_avx512 takes, for callers that fold ln 2 into their own multiply.
__attribute__((target("avx512f"), always_inline)) inline __m512 exp2_avx512(__m512 z) {
  const __m512 k = _mm512_roundscale_ps(z, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(z, k);
  __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);                  // ln(2)^6 / 6!
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3333558146428443e-3f));  // ln(2)^5 / 5!
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6181291076284772e-3f));  // ln(2)^4 / 4!
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5504108664821580e-2f));  // ln(2)^3 / 3!
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.24022650695910071f));    // ln(2)^2 / 2
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.69314718055994531f));    // ln(2)
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

/// The softmax row of bf16 attention on AMX (ops/attention.hpp), with the scale of
/// QKᵀ folded in (AMX's products cannot scale): e_j = exp(capped(scale · s_j) − m)
/// and their sum; then e_j / Σ rounded to bf16 by AVX512_BF16's instruction, into
/// probabilities[0, visible), and zeros up to `padded` (a multiple of 32).
/// - The shift m only keeps the exponentials in range, and cancels in e_j / Σ. With
///   a cap c ≤ 64 every capped score lies in [−c, c], so m = 0: e^(±c) is a normal
///   float (e^±64 is 2^±92.3) and 2^24 of them sum to at most 2^117. That saves the
///   pass that finds the maximum, which reads the row from L2 (the tile of scores is
///   larger than L1): 17 % of this function's time at T = 1024 (perf, Intel Xeon).
/// - Otherwise (no cap, or a larger one) m = capped(scale · max), the largest capped
///   score up to the rounding of tanh: a positive scale and the cap are increasing.
/// - The exponential runs in base 2 with cap · log2(e) folded into one FMA: the
///   result's relative error is a few ulp of the exponent, which is at most
///   2 · cap · log2(e) with a cap and |scale · s · log2(e)| without one, as
///   exp_shifted_capped's is of its argument; the probabilities keep 8 bits.
/// - The instruction rounds to nearest even as float_to_bf16 does, but flushes
///   subnormal results (below 1.2e-38) to zero, which no product can tell.
__attribute__((target("avx512f,avx512dq,avx512bw,avx512bf16"))) inline void softmax_row_to_bf16_avx512(
    float* scores, Index visible, Index padded, float scale, float cap, bf16* probabilities) {
  if (visible < 1 || padded < visible || padded % 32 != 0)
    throw InvalidArgument("softmax_row_to_bf16: needs 1 <= visible <= padded, padded a multiple of 32; got visible " +
                          std::to_string(visible) + ", padded " + std::to_string(padded));
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLargestUnshiftedCap = 64.0f;
  constexpr Index kLongestUnshiftedRow = Index{1} << 24;
  const Index full = visible / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (visible - full)) - 1u);
  const bool capped = cap > 0.0f;
  alignas(64) float lanes[16];  // (GCC 12 warns inside _mm512_reduce_*_ps)
  float shift = 0.0f;           // m, in the units of the capped scores
  if (!(capped && cap <= kLargestUnshiftedCap && visible <= kLongestUnshiftedRow)) {
    __m512 max = _mm512_set1_ps(-INFINITY);
    for (Index j = 0; j < full; j += 16) max = _mm512_max_ps(max, _mm512_loadu_ps(scores + j));
    if (tail) max = _mm512_mask_max_ps(max, tail, max, _mm512_maskz_loadu_ps(tail, scores + full));
    _mm512_store_ps(lanes, max);
    float row_max = lanes[0];
    for (int l = 1; l < 16; ++l) row_max = std::max(row_max, lanes[l]);
    // (scale = 1 multiplies nothing: a multiply by 1 would flush a subnormal maximum
    // under a caller's flush-to-zero mode.)
    _mm512_store_ps(lanes, capped_avx512(_mm512_set1_ps(scale != 1.0f ? row_max * scale : row_max), cap));
    shift = lanes[0];
  }

  // z = log2(e) · (capped(scale · s) − m), as tanh(s · scale / cap) times cap · log2(e),
  // or s times scale · log2(e), plus one constant.
  const __m512 inner = _mm512_set1_ps(capped ? scale / cap : scale * kLog2e);
  const __m512 outer = _mm512_set1_ps(capped ? cap * kLog2e : 1.0f);
  const __m512 offset = _mm512_set1_ps(-shift * kLog2e);
  const __m512 lowest = _mm512_set1_ps(-150.0f);  // 2^-150 is 0 in float; keeps -inf from making NaN
  auto exponent = [&](__m512 s) __attribute__((target("avx512f,avx512dq"))) {
    const __m512 x = _mm512_mul_ps(s, inner);
    return _mm512_max_ps(lowest, _mm512_fmadd_ps(capped ? tanh_avx512(x) : x, outer, offset));  // NaN stays
  };
  __m512 sum = _mm512_setzero_ps();
  for (Index j = 0; j < full; j += 16) {
    const __m512 e = exp2_avx512(exponent(_mm512_loadu_ps(scores + j)));
    _mm512_storeu_ps(scores + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (tail) {
    const __m512 e = exp2_avx512(exponent(_mm512_maskz_loadu_ps(tail, scores + full)));
    _mm512_mask_storeu_ps(scores + full, tail, e);
    sum = _mm512_mask_add_ps(sum, tail, sum, e);
  }
  _mm512_store_ps(lanes, sum);
  float total = 0.0f;
  for (float lane : lanes) total += lane;

  const __m512 inverse = _mm512_set1_ps(1.0f / total);
  auto store_pair = [&](Index j, __m512 a, __m512 b) __attribute__((target("avx512f,avx512bf16"))) {
    _mm512_storeu_si512(probabilities + j, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
  };
  Index j = 0;
  for (; j + 32 <= visible; j += 32)
    store_pair(j, _mm512_mul_ps(_mm512_loadu_ps(scores + j), inverse),
               _mm512_mul_ps(_mm512_loadu_ps(scores + j + 16), inverse));
  // The last visible values and the zeros after them. The product is masked as well as
  // the load: a NaN row's inverse would turn a zero into NaN.
  for (; j < padded; j += 32) {
    auto lanes_visible = [&](Index from) {
      return static_cast<__mmask16>((1u << std::clamp<Index>(visible - from, 0, 16)) - 1u);
    };
    const __mmask16 low = lanes_visible(j), high = lanes_visible(j + 16);
    store_pair(j, _mm512_maskz_mul_ps(low, _mm512_maskz_loadu_ps(low, scores + j), inverse),
               _mm512_maskz_mul_ps(high, _mm512_maskz_loadu_ps(high, scores + j + 16), inverse));
  }
}
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
