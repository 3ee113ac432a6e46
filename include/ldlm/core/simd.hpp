// Vectors of float lanes over AVX2 (F32x8) and AVX-512 (F32x16), so that a kernel is
// written once, as a template on the vector type, and instantiated for each target.
//
// How a kernel is put together:
// - Its entry point is an ordinary function with the target attribute (for example
//   target("avx512f,avx512dq")), called only after the CPU check (core/cpu.hpp).
// - The entry point calls the kernel template, marked LDLM_SIMD_KERNEL: always
//   inlined, with no target of its own.
// - The operations below carry their own target and are plain inline. A function is
//   inlined only into a caller whose target has all of its features, so once the
//   template sits in the entry point, every operation is inlined there.
// Two other arrangements do not compile. An always_inline operation is inlined into
// the template's own body first, which has the default target: a compile error. A raw
// __m512 in the signature of a function without AVX-512 changes the calling convention
// (-Wpsabi): the registers are wrapped in structs for that.
// An entry point whose target lacks a feature of an operation it uses gets a call
// instead of the instruction, not an error: name every feature its operations name.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LDLM_HAVE_X86_SIMD 1
#endif

// Around ldlm's own code that calls AVX-512 intrinsics: GCC 12 reports the deliberately
// undefined operand of those intrinsics as maybe used uninitialized once they are
// inlined, the false positive core/eigen.hpp describes (PR 105593), dozens of times per
// translation unit built with -Wall -march=native. GCC looks the warning up at every
// location of the inlining chain, so a chain that passes through a kernel in such a
// region is silenced, and only those chains.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#define LDLM_INTRINSICS_BEGIN                                     \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define LDLM_INTRINSICS_END _Pragma("GCC diagnostic pop")
#else
#define LDLM_INTRINSICS_BEGIN
#define LDLM_INTRINSICS_END
#endif

/// A kernel template: inlined into its entry point, whose target it takes.
#define LDLM_SIMD_KERNEL __attribute__((always_inline)) inline

#if defined(LDLM_HAVE_X86_SIMD)
#define LDLM_AVX2 __attribute__((target("avx2")))
#define LDLM_AVX2_FMA __attribute__((target("avx2,fma")))
#define LDLM_AVX512 __attribute__((target("avx512f")))
#define LDLM_AVX512_DQ __attribute__((target("avx512f,avx512dq")))
#define LDLM_AVX512_BW __attribute__((target("avx512f,avx512bw")))

namespace ldlm::simd {
LDLM_INTRINSICS_BEGIN

/// 32-bit integer lanes: the bits of the float lanes of F32x8 / F32x16.
struct I32x8 {
  __m256i v;
  LDLM_AVX2 static I32x8 set1(std::int32_t x) { return {_mm256_set1_epi32(x)}; }
};
struct I32x16 {
  __m512i v;
  LDLM_AVX512 static I32x16 set1(std::int32_t x) { return {_mm512_set1_epi32(x)}; }
};

/// 8 float lanes (AVX2; fmadd and fnmadd also need FMA).
struct F32x8 {
  static constexpr int kLanes = 8;
  using Bits = I32x8;
  struct Mask {
    __m256 m;  // all ones in the lanes that are set
  };
  __m256 v;

  LDLM_AVX2 static F32x8 set1(float x) { return {_mm256_set1_ps(x)}; }
  LDLM_AVX2 static F32x8 load(const float* p) { return {_mm256_loadu_ps(p)}; }
  LDLM_AVX2 void store(float* p) const { _mm256_storeu_ps(p, v); }
  /// The lanes [0, count), count clamped to [0, 8].
  LDLM_AVX2 static Mask first(std::int64_t count) {
    const int c = static_cast<int>(std::clamp<std::int64_t>(count, 0, kLanes));
    return {_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)))};
  }
  /// The lanes of m from p, zero in the others; only those lanes are read.
  LDLM_AVX2 static F32x8 load(Mask m, const float* p) { return {_mm256_maskload_ps(p, _mm256_castps_si256(m.m))}; }
  LDLM_AVX2 void store(Mask m, float* p) const { _mm256_maskstore_ps(p, _mm256_castps_si256(m.m), v); }
};

/// 16 float lanes (AVX-512F; the bitwise float operations also need AVX512DQ).
struct F32x16 {
  static constexpr int kLanes = 16;
  using Bits = I32x16;
  struct Mask {
    __mmask16 m;
  };
  __m512 v;

  LDLM_AVX512 static F32x16 set1(float x) { return {_mm512_set1_ps(x)}; }
  LDLM_AVX512 static F32x16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  LDLM_AVX512 void store(float* p) const { _mm512_storeu_ps(p, v); }
  static Mask first(std::int64_t count) {
    return {static_cast<__mmask16>((1u << std::clamp<std::int64_t>(count, 0, kLanes)) - 1u)};
  }
  LDLM_AVX512 static F32x16 load(Mask m, const float* p) { return {_mm512_maskz_loadu_ps(m.m, p)}; }
  LDLM_AVX512 void store(Mask m, float* p) const { _mm512_mask_storeu_ps(p, m.m, v); }
};

// Arithmetic, one rounding each; fmadd(a, b, c) = a·b + c and fnmadd(a, b, c) = c − a·b
// round once. min and max return b when either is NaN, as vminps and vmaxps do.
LDLM_AVX2 inline F32x8 operator+(F32x8 a, F32x8 b) { return {_mm256_add_ps(a.v, b.v)}; }
LDLM_AVX2 inline F32x8 operator-(F32x8 a, F32x8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
LDLM_AVX2 inline F32x8 operator*(F32x8 a, F32x8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
LDLM_AVX2 inline F32x8 operator/(F32x8 a, F32x8 b) { return {_mm256_div_ps(a.v, b.v)}; }
LDLM_AVX2_FMA inline F32x8 fmadd(F32x8 a, F32x8 b, F32x8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
LDLM_AVX2_FMA inline F32x8 fnmadd(F32x8 a, F32x8 b, F32x8 c) { return {_mm256_fnmadd_ps(a.v, b.v, c.v)}; }
LDLM_AVX2 inline F32x8 min(F32x8 a, F32x8 b) { return {_mm256_min_ps(a.v, b.v)}; }
LDLM_AVX2 inline F32x8 max(F32x8 a, F32x8 b) { return {_mm256_max_ps(a.v, b.v)}; }
LDLM_AVX2 inline F32x8 round_to_nearest(F32x8 a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}

LDLM_AVX512 inline F32x16 operator+(F32x16 a, F32x16 b) { return {_mm512_add_ps(a.v, b.v)}; }
LDLM_AVX512 inline F32x16 operator-(F32x16 a, F32x16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
LDLM_AVX512 inline F32x16 operator*(F32x16 a, F32x16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
LDLM_AVX512 inline F32x16 operator/(F32x16 a, F32x16 b) { return {_mm512_div_ps(a.v, b.v)}; }
LDLM_AVX512 inline F32x16 fmadd(F32x16 a, F32x16 b, F32x16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
LDLM_AVX512 inline F32x16 fnmadd(F32x16 a, F32x16 b, F32x16 c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }
LDLM_AVX512 inline F32x16 min(F32x16 a, F32x16 b) { return {_mm512_min_ps(a.v, b.v)}; }
LDLM_AVX512 inline F32x16 max(F32x16 a, F32x16 b) { return {_mm512_max_ps(a.v, b.v)}; }
LDLM_AVX512 inline F32x16 round_to_nearest(F32x16 a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}

// Signs and bits.
LDLM_AVX2 inline F32x8 abs(F32x8 a) { return {_mm256_and_ps(a.v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)))}; }
LDLM_AVX2 inline F32x8 sign_bit(F32x8 a) {
  return {_mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), a.v)};
}
LDLM_AVX2 inline F32x8 operator|(F32x8 a, F32x8 b) { return {_mm256_or_ps(a.v, b.v)}; }
LDLM_AVX512_DQ inline F32x16 abs(F32x16 a) {
  return {_mm512_and_ps(a.v, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff)))};
}
LDLM_AVX512_DQ inline F32x16 sign_bit(F32x16 a) {
  return {_mm512_andnot_ps(_mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff)), a.v)};
}
LDLM_AVX512_DQ inline F32x16 operator|(F32x16 a, F32x16 b) { return {_mm512_or_ps(a.v, b.v)}; }

LDLM_AVX2 inline I32x8 bits(F32x8 a) { return {_mm256_castps_si256(a.v)}; }
LDLM_AVX2 inline F32x8 from_bits(I32x8 a) { return {_mm256_castsi256_ps(a.v)}; }
LDLM_AVX2 inline I32x8 operator+(I32x8 a, I32x8 b) { return {_mm256_add_epi32(a.v, b.v)}; }
LDLM_AVX2 inline I32x8 operator&(I32x8 a, I32x8 b) { return {_mm256_and_si256(a.v, b.v)}; }
LDLM_AVX2 inline I32x8 operator|(I32x8 a, I32x8 b) { return {_mm256_or_si256(a.v, b.v)}; }
LDLM_AVX2 inline I32x8 shift_right_16(I32x8 a) { return {_mm256_srli_epi32(a.v, 16)}; }
LDLM_AVX512 inline I32x16 bits(F32x16 a) { return {_mm512_castps_si512(a.v)}; }
LDLM_AVX512 inline F32x16 from_bits(I32x16 a) { return {_mm512_castsi512_ps(a.v)}; }
LDLM_AVX512 inline I32x16 operator+(I32x16 a, I32x16 b) { return {_mm512_add_epi32(a.v, b.v)}; }
LDLM_AVX512 inline I32x16 operator&(I32x16 a, I32x16 b) { return {_mm512_and_si512(a.v, b.v)}; }
LDLM_AVX512 inline I32x16 operator|(I32x16 a, I32x16 b) { return {_mm512_or_si512(a.v, b.v)}; }
LDLM_AVX512 inline I32x16 shift_right_16(I32x16 a) { return {_mm512_srli_epi32(a.v, 16)}; }

// Comparisons and selection.
/// The lanes where a ≥ b or either is NaN.
LDLM_AVX2 inline F32x8::Mask not_less(F32x8 a, F32x8 b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_NLT_UQ)}; }
LDLM_AVX2 inline F32x8::Mask is_nan(F32x8 a) { return {_mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q)}; }
LDLM_AVX2 inline bool any(F32x8::Mask m) { return _mm256_movemask_ps(m.m) != 0; }
LDLM_AVX2 inline F32x8::Mask operator|(F32x8::Mask a, F32x8::Mask b) { return {_mm256_or_ps(a.m, b.m)}; }
/// m ? a : b, lane by lane.
LDLM_AVX2 inline F32x8 select(F32x8::Mask m, F32x8 a, F32x8 b) { return {_mm256_blendv_ps(b.v, a.v, m.m)}; }
LDLM_AVX2 inline I32x8 select(F32x8::Mask m, I32x8 a, I32x8 b) {
  return {_mm256_blendv_epi8(b.v, a.v, _mm256_castps_si256(m.m))};
}
/// a in the lanes of m, zero in the others.
LDLM_AVX2 inline F32x8 zero_unless(F32x8::Mask m, F32x8 a) { return {_mm256_and_ps(m.m, a.v)}; }
LDLM_AVX512 inline F32x16::Mask not_less(F32x16 a, F32x16 b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_NLT_UQ)}; }
LDLM_AVX512 inline F32x16::Mask is_nan(F32x16 a) { return {_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q)}; }
inline bool any(F32x16::Mask m) { return m.m != 0; }
inline F32x16::Mask operator|(F32x16::Mask a, F32x16::Mask b) { return {static_cast<__mmask16>(a.m | b.m)}; }
LDLM_AVX512 inline F32x16 select(F32x16::Mask m, F32x16 a, F32x16 b) { return {_mm512_mask_blend_ps(m.m, b.v, a.v)}; }
LDLM_AVX512 inline I32x16 select(F32x16::Mask m, I32x16 a, I32x16 b) {
  return {_mm512_mask_blend_epi32(m.m, b.v, a.v)};
}
LDLM_AVX512 inline F32x16 zero_unless(F32x16::Mask m, F32x16 a) { return {_mm512_maskz_mov_ps(m.m, a.v)}; }
/// m ? (a | b) : otherwise, lane by lane: one masked instruction on AVX-512, where
/// select(m, a | b, otherwise) costs two.
LDLM_AVX2 inline I32x8 or_where(F32x8::Mask m, I32x8 a, I32x8 b, I32x8 otherwise) { return select(m, a | b, otherwise); }
LDLM_AVX512 inline I32x16 or_where(F32x16::Mask m, I32x16 a, I32x16 b, I32x16 otherwise) {
  return {_mm512_mask_or_epi32(otherwise.v, m.m, a.v, b.v)};
}

// Powers of two; k holds integers.
/// p · 2^k rounded once, to a subnormal, zero or infinity at the ends (vscalefps).
/// AVX2 has no vscalefps: 2^⌊k/2⌋ · 2^(k−⌊k/2⌋) are two normal powers of two for
/// every k in [−150, 128], so only the second multiply rounds.
LDLM_AVX2 inline __m256 power_of_two(__m256i e) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}
LDLM_AVX2 inline F32x8 times_pow2(F32x8 p, F32x8 k) {
  const __m256i ki = _mm256_cvtps_epi32(k.v);
  const __m256i k_low = _mm256_srai_epi32(ki, 1), k_high = _mm256_sub_epi32(ki, k_low);
  __m256 e = _mm256_mul_ps(_mm256_mul_ps(p.v, power_of_two(k_low)), power_of_two(k_high));
  // Rounded here, as vscalefps's result is: the compiler would otherwise fuse this
  // multiply into a caller's add (tanh's 1 ± e) as an FMA.
  __asm__("" : "+x"(e));
  return {e};
}
LDLM_AVX512 inline F32x16 times_pow2(F32x16 p, F32x16 k) { return {_mm512_scalef_ps(p.v, k.v)}; }
/// p · 2^k by adding k to the exponent field: exact while the result is a normal float,
/// garbage otherwise (callers keep it in range).
LDLM_AVX2 inline F32x8 add_to_exponent(F32x8 p, F32x8 k) {
  return {
      _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p.v), _mm256_slli_epi32(_mm256_cvtps_epi32(k.v), 23)))};
}
LDLM_AVX512 inline F32x16 add_to_exponent(F32x16 p, F32x16 k) {
  return {
      _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p.v), _mm512_slli_epi32(_mm512_cvtps_epi32(k.v), 23)))};
}

// bfloat16 stores. Each lane of a holds a bf16 value in its upper 16 bits. A kernel
// makes its UpperHalves once, before its loop, so that AVX-512's permutation table is
// built once per call instead of being left to the compiler to hoist.
struct UpperHalves8 {
  /// The upper halves of a's lanes, then of b's: 16 bf16 values to `to`.
  LDLM_AVX2 void store(void* to, I32x8 a, I32x8 b) const {
    // packus works within 128-bit lanes: [a 0-3, b 0-3, a 4-7, b 4-7], reordered.
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(a.v, 16), _mm256_srli_epi32(b.v, 16));
    _mm256_storeu_si256(static_cast<__m256i*>(to), _mm256_permute4x64_epi64(packed, 0xd8));
  }
  LDLM_AVX2 void store(void* to, I32x8 a) const {
    const __m256i low = _mm256_srli_epi32(a.v, 16);
    _mm_storeu_si128(static_cast<__m128i*>(to),
                     _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(low, low), 0xd8)));
  }
};
struct UpperHalves16 {
  __m512i odd_halves;
  LDLM_AVX512_BW UpperHalves16()
      : odd_halves(_mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23,
                                    21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1)) {}
  LDLM_AVX512_BW void store(void* to, I32x16 a, I32x16 b) const {
    _mm512_storeu_si512(to, _mm512_permutex2var_epi16(a.v, odd_halves, b.v));
  }
  LDLM_AVX512 void store(void* to, I32x16 a) const {
    _mm256_storeu_si256(static_cast<__m256i*>(to), _mm512_cvtepi32_epi16(_mm512_srli_epi32(a.v, 16)));
  }
};
/// The UpperHalves of V's lane count.
template <class V>
using UpperHalves = std::conditional_t<V::kLanes == 8, UpperHalves8, UpperHalves16>;

// Kernels' building blocks.
/// Lanes through memory, in lane order: the same order for every vector width when a
/// group of vectors is stored side by side. (GCC 12 warns inside _mm512_reduce_*_ps.)
template <class V, int G>
LDLM_SIMD_KERNEL void store_lanes(const V (&x)[G], float* lanes) {
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) x[h].store(lanes + h * V::kLanes);
}

/// The sum of the lanes, from lane 0 up.
template <class V>
LDLM_SIMD_KERNEL float sum_of_lanes(const V& x) {
  alignas(64) float lanes[V::kLanes];
  x.store(lanes);
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  return total;
}

/// p ← the polynomial with coefficients c (highest degree first) at x, by Horner's
/// rule, for each vector of a group. The vectors' chains interleave, so that each
/// step has G independent FMAs in flight.
template <class V, int G, std::size_t N>
LDLM_SIMD_KERNEL void horner(V (&p)[G], const V (&x)[G], const float (&c)[N]) {
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) p[h] = V::set1(c[0]);
#pragma GCC unroll 16
  for (std::size_t i = 1; i < N; ++i)
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) p[h] = fmadd(p[h], x[h], V::set1(c[i]));
}

/// horner on one vector.
template <class V, std::size_t N>
LDLM_SIMD_KERNEL V horner(const V& x, const float (&c)[N]) {
  V p[1];
  const V xs[1] = {x};
  horner(p, xs, c);
  return p[0];
}

LDLM_INTRINSICS_END
}  // namespace ldlm::simd
#endif
