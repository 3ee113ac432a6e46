// Numeric precision of the matrix products, bfloat16 values, and the widening of
// IEEE binary16 (checkpoints' F16 tensors).
//
// The model was trained under bf16 autocast; ldlm's bf16 mode mirrors it (see
// docs/model.md §Precision): every matrix product takes bf16 operands (weights and
// activations, attention's QKᵀ and P·V included) and accumulates and returns fp32,
// while norms, softmax, softcap, rotary, modulation, residuals and the residual
// stream stay fp32. The product of two bf16 values is exact in fp32, so a bf16
// product can also run on fp32 kernels over bf16-rounded activations and bf16
// weights widened to fp32, with the same result up to summation order: that is how
// CPUs without bf16 instructions run this mode (PackedMatrix::widened).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "ldlm/core/cpu.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/simd.hpp"

namespace ldlm {

/// int8: the trained modules' Linear products (all but the denoiser's adaLN, time MLP,
/// input and output maps) on s8 weights (one scale per output channel) and s8
/// activations (one scale per row), s32 sums; everything else as in bf16
/// (ops/packed_matrix.hpp, docs/model.md §int8).
enum class Precision { fp32, bf16, int8 };

inline constexpr std::string_view precision_name(Precision p) {
  return p == Precision::bf16 ? "bf16" : p == Precision::int8 ? "int8" : "fp32";
}

/// "fp32" / "bf16" / "int8" -> Precision; nothing for any other name.
inline std::optional<Precision> find_precision(std::string_view s) {
  for (const Precision p : {Precision::fp32, Precision::bf16, Precision::int8})
    if (s == precision_name(p)) return p;
  return std::nullopt;
}

/// "fp32" / "bf16" / "int8" -> Precision; anything else is an InvalidArgument naming `where`.
inline Precision parse_precision(std::string_view s, std::string_view where = "precision") {
  if (const std::optional<Precision> p = find_precision(s)) return *p;
  throw InvalidArgument(std::string(where) + ": expected 'fp32', 'bf16' or 'int8', got '" + std::string(s) + "'");
}

/// A bfloat16 value as its 16 bits: the top half of an IEEE binary32.
enum class bf16 : std::uint16_t {};

inline float bf16_to_float(bf16 h) { return std::bit_cast<float>(std::uint32_t(h) << 16); }

/// Round to nearest even, NaN kept quiet, subnormals kept: the rounding of
/// torch's `.to(torch.bfloat16)`, so bf16 references can be matched bit for bit.
inline bf16 float_to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16((u >> 16) | 0x40u);
  return bf16((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// f rounded to the nearest bf16 value, as a float.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

/// IEEE binary16 (its 16 bits) -> binary32, exact: normals, subnormals, signed zero,
/// infinities and NaN payloads.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: mant * 2^-24; normalise so the leading 1 lands in bit 10
    exp = 113;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

namespace detail {
/// x · inverse_scale rounded to the nearest integer (ties to even) in [-127, 127].
inline std::int8_t quantize_s8_value(float x, float inverse_scale) {
  return static_cast<std::int8_t>(std::clamp(std::nearbyint(x * inverse_scale), -127.0f, 127.0f));
}

/// The running max|x| of quantize_s8, NaN once any value is NaN.
inline float quantize_s8_largest(float largest, float x) {
  return std::isnan(x) || std::isnan(largest) ? std::numeric_limits<float>::quiet_NaN()
                                              : std::max(largest, std::fabs(x));
}

/// A row with a NaN or an infinity: zeros with a NaN scale, so that its products are
/// NaN, as in fp32, rather than quietly finite.
inline float quantize_s8_not_finite(std::int64_t n, std::int8_t* q) {
  std::fill_n(q, n, std::int8_t(0));
  return std::numeric_limits<float>::quiet_NaN();
}

/// x · scale, or x untouched when scale = 1: a multiply by 1 would flush a subnormal x
/// under a caller's flush-to-zero mode.
inline float scaled_value(float x, float scale) { return scale != 1.0f ? x * scale : x; }

#if defined(LDLM_HAVE_X86_SIMD)
LDLM_INTRINSICS_BEGIN
#define LDLM_HAVE_X86_KERNELS 1
/// float_to_bf16's arithmetic in every lane, bit for bit (the bf16 conversion
/// instructions flush subnormals, so they are not used), with the result in the
/// upper 16 bits of each lane and garbage below.
template <class V>
LDLM_SIMD_KERNEL typename V::Bits bf16_high_bits(const V& v) {
  using I = typename V::Bits;
  const I u = simd::bits(v);
  const I lsb = simd::shift_right_16(u) & I::set1(1);
  const I rounded = u + (lsb + I::set1(0x7fff));
  return simd::or_where(simd::is_nan(v), u, I::set1(0x400000), rounded);
}

/// V::kLanes values from x, times factor when scale_values (scale != 1, as in scaled_value).
template <class V>
LDLM_SIMD_KERNEL V scaled_values(const float* x, const V& factor, bool scale_values) {
  const V v = V::load(x);
  return scale_values ? factor * v : v;
}

/// One pass, so that attention's probabilities are normalised as they are narrowed:
/// a multiply, the rounding, and the upper halves of two vectors packed into one.
template <class V>
LDLM_SIMD_KERNEL void to_bf16_simd(const float* x, std::int64_t n, bf16* y, float scale) {
  constexpr int L = V::kLanes;
  const bool scale_values = scale != 1.0f;
  const V factor = V::set1(scale);
  const simd::UpperHalves<V> upper_halves;
  const std::int64_t pairs = n - n % (2 * L), vectors = n - n % L;
  for (std::int64_t i = 0; i < pairs; i += 2 * L)
    upper_halves.store(y + i, bf16_high_bits(scaled_values(x + i, factor, scale_values)),
                       bf16_high_bits(scaled_values(x + i + L, factor, scale_values)));
  if (pairs < vectors) upper_halves.store(y + pairs, bf16_high_bits(scaled_values(x + pairs, factor, scale_values)));
  // The tail counts from `vectors`, not on from the body's counter: inlined with a
  // constant n, GCC 12 took such a tail for one that overflows and warned.
  for (std::int64_t i = vectors; i < n; ++i) y[i] = float_to_bf16(scaled_value(x[i], scale));
}

template <class V>
LDLM_SIMD_KERNEL void round_to_bf16_simd(const float* x, std::int64_t n, float* y, float scale) {
  using I = typename V::Bits;
  constexpr int L = V::kLanes;
  const bool scale_values = scale != 1.0f;
  const V factor = V::set1(scale);
  const I high_half = I::set1(static_cast<std::int32_t>(0xffff0000u));
  const std::int64_t vectors = n - n % L;
  for (std::int64_t i = 0; i < vectors; i += L)
    simd::from_bits(bf16_high_bits(scaled_values(x + i, factor, scale_values)) & high_half).store(y + i);
  for (std::int64_t i = vectors; i < n; ++i) y[i] = ldlm::round_to_bf16(scaled_value(x[i], scale));
}

// Not inlined: inlined into a caller's loop, GCC 12 reloaded the permutation table of
// UpperHalves16 on every pass (bench/bench_kernels.cpp's to_bf16 shows it).
__attribute__((target("avx512f,avx512bw"), noinline)) inline void to_bf16_avx512(const float* x, std::int64_t n,
                                                                                 bf16* y, float scale) {
  to_bf16_simd<simd::F32x16>(x, n, y, scale);
}
__attribute__((target("avx512f"))) inline void round_to_bf16_avx512(const float* x, std::int64_t n, float* y,
                                                                    float scale) {
  round_to_bf16_simd<simd::F32x16>(x, n, y, scale);
}
__attribute__((target("avx2"))) inline void to_bf16_avx2(const float* x, std::int64_t n, bf16* y, float scale) {
  to_bf16_simd<simd::F32x8>(x, n, y, scale);
}
__attribute__((target("avx2"))) inline void round_to_bf16_avx2(const float* x, std::int64_t n, float* y, float scale) {
  round_to_bf16_simd<simd::F32x8>(x, n, y, scale);
}

/// bf16 to float, 8 lanes at a time: a zero extension and a shift, exact.
__attribute__((target("avx2"))) inline void bf16_to_float_avx2(const bf16* x, std::int64_t n, float* y) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))), 16)));
  for (; i < n; ++i) y[i] = bf16_to_float(x[i]);
}

/// quantize_s8 on AVX-512: the same arithmetic as quantize_s8_value in every lane (the
/// conversion rounds to nearest even under the default rounding mode, as nearbyint).
__attribute__((target("avx512f,avx512bw"))) inline float quantize_s8_avx512(const float* x, std::int64_t n,
                                                                            std::int8_t* q) {
  const std::int64_t vectors = n - n % 16;
  __m512 largest = _mm512_setzero_ps();
  __mmask16 unordered = 0;  // max_ps drops NaNs: they are looked for apart
  for (std::int64_t i = 0; i < vectors; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    largest = _mm512_max_ps(largest, _mm512_abs_ps(v));
  }
  float m = unordered ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(largest);
  for (std::int64_t i = vectors; i < n; ++i) m = quantize_s8_largest(m, x[i]);
  if (!std::isfinite(m)) return quantize_s8_not_finite(n, q);
  const float inv = m > 0.0f ? 127.0f / m : 0.0f;
  const __m512 factor = _mm512_set1_ps(inv);
  for (std::int64_t i = 0; i < vectors; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), factor))));
  for (std::int64_t i = vectors; i < n; ++i) q[i] = quantize_s8_value(x[i], inv);
  return m > 0.0f ? m / 127.0f : 1.0f;
}
LDLM_INTRINSICS_END
#endif
}  // namespace detail

/// y[i] = float_to_bf16(x[i] · scale), the product rounded to fp32 first (as a
/// separate multiply would); with scale = 1, y[i] = float_to_bf16(x[i]) and nothing
/// is multiplied. y must not overlap x.
inline void to_bf16(const float* x, std::int64_t n, bf16* y, float scale = 1.0f) {
#if defined(LDLM_HAVE_X86_KERNELS)
  if (cpu_features().avx512bw) return detail::to_bf16_avx512(x, n, y, scale);
  if (cpu_features().avx2) return detail::to_bf16_avx2(x, n, y, scale);
#endif
  for (std::int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(detail::scaled_value(x[i], scale));
}

/// y[i] = bf16_to_float(x[i]), exact. y must not overlap x.
inline void bf16_to_float(const bf16* x, std::int64_t n, float* y) {
#if defined(LDLM_HAVE_X86_KERNELS)
  if (cpu_features().avx2) return detail::bf16_to_float_avx2(x, n, y);
#endif
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}

/// Symmetric s8 quantization of n values with one scale: returns scale = max|x| / 127
/// (1 for all zeros) and writes q[i] = round(x[i] · 127 / max|x|), so x[i] ≈ q[i] ·
/// scale. A NaN or an infinity among them gives zeros and a NaN scale. int8 products
/// quantize each weight's output channel and each activation row with it.
inline float quantize_s8(const float* x, std::int64_t n, std::int8_t* q) {
#if defined(LDLM_HAVE_X86_KERNELS)
  if (cpu_features().avx512bw) return detail::quantize_s8_avx512(x, n, q);
#endif
  float m = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) m = detail::quantize_s8_largest(m, x[i]);
  if (!std::isfinite(m)) return detail::quantize_s8_not_finite(n, q);
  const float inv = m > 0.0f ? 127.0f / m : 0.0f;
  for (std::int64_t i = 0; i < n; ++i) q[i] = detail::quantize_s8_value(x[i], inv);
  return m > 0.0f ? m / 127.0f : 1.0f;
}

/// y[i] = round_to_bf16(x[i] · scale), as to_bf16; y may be x.
inline void round_to_bf16(const float* x, std::int64_t n, float* y, float scale = 1.0f) {
#if defined(LDLM_HAVE_X86_KERNELS)
  if (cpu_features().avx512f) return detail::round_to_bf16_avx512(x, n, y, scale);
  if (cpu_features().avx2) return detail::round_to_bf16_avx2(x, n, y, scale);
#endif
  for (std::int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(detail::scaled_value(x[i], scale));
}

}  // namespace ldlm
