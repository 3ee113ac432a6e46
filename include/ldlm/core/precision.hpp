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

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "ldlm/core/cpu.hpp"
#include "ldlm/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ldlm {

enum class Precision { fp32, bf16 };

inline constexpr std::string_view precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

/// "fp32" / "bf16" -> Precision; anything else is an InvalidArgument naming `where`.
inline Precision parse_precision(std::string_view s, std::string_view where = "precision") {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  throw InvalidArgument(std::string(where) + ": expected 'fp32' or 'bf16', got '" + std::string(s) + "'");
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
/// x · scale, or x untouched when scale = 1: a multiply by 1 would flush a subnormal x
/// under a caller's flush-to-zero mode.
inline float scaled_value(float x, float scale) { return scale != 1.0f ? x * scale : x; }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LDLM_HAVE_X86_KERNELS 1
/// 16 lanes of float_to_bf16's arithmetic, bit for bit (the bf16 conversion
/// instruction flushes subnormals, so it is not used), with the result in the
/// upper 16 bits of each lane and garbage below.
__attribute__((target("avx512f"))) inline __m512i bf16_high_bits_avx512(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x400000));
}

/// 16 values from x, times factor when scale_values (scale != 1, as in scaled_value).
__attribute__((target("avx512f"))) inline __m512 scaled_values_avx512(const float* x, __m512 factor,
                                                                      bool scale_values) {
  const __m512 v = _mm512_loadu_ps(x);
  return scale_values ? _mm512_mul_ps(factor, v) : v;
}

/// One pass, so that attention's probabilities are normalised as they are narrowed:
/// a multiply, the rounding, and one permute that packs the upper halves of 32 lanes.
__attribute__((target("avx512f,avx512bw"))) inline void to_bf16_avx512(const float* x, std::int64_t n, bf16* y,
                                                                       float scale) {
  const bool scale_values = scale != 1.0f;
  const __m512 factor = _mm512_set1_ps(scale);
  const __m512i odd_halves = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29,
                                              27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i low = bf16_high_bits_avx512(scaled_values_avx512(x + i, factor, scale_values));
    const __m512i high = bf16_high_bits_avx512(scaled_values_avx512(x + i + 16, factor, scale_values));
    _mm512_storeu_si512(y + i, _mm512_permutex2var_epi16(low, odd_halves, high));
  }
  if (i + 16 <= n) {
    const __m512i bits = bf16_high_bits_avx512(scaled_values_avx512(x + i, factor, scale_values));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
    i += 16;
  }
  for (; i < n; ++i) y[i] = float_to_bf16(scaled_value(x[i], scale));
}

__attribute__((target("avx512f"))) inline void round_to_bf16_avx512(const float* x, std::int64_t n, float* y,
                                                                    float scale) {
  const bool scale_values = scale != 1.0f;
  const __m512 factor = _mm512_set1_ps(scale);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_and_si512(
                                bf16_high_bits_avx512(scaled_values_avx512(x + i, factor, scale_values)), high_half)));
  for (; i < n; ++i) y[i] = round_to_bf16(scaled_value(x[i], scale));
}

/// The same two conversions on AVX2, 8 lanes at a time, bit for bit float_to_bf16's.
__attribute__((target("avx2"))) inline __m256i bf16_high_bits_avx2(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
}

__attribute__((target("avx2"))) inline __m256 scaled_values_avx2(const float* x, __m256 factor, bool scale_values) {
  const __m256 v = _mm256_loadu_ps(x);
  return scale_values ? _mm256_mul_ps(factor, v) : v;
}

__attribute__((target("avx2"))) inline void to_bf16_avx2(const float* x, std::int64_t n, bf16* y, float scale) {
  const bool scale_values = scale != 1.0f;
  const __m256 factor = _mm256_set1_ps(scale);
  const std::int64_t full = n - n % 16;
  for (std::int64_t i = 0; i < full; i += 16) {
    const __m256i low = _mm256_srli_epi32(bf16_high_bits_avx2(scaled_values_avx2(x + i, factor, scale_values)), 16);
    const __m256i high =
        _mm256_srli_epi32(bf16_high_bits_avx2(scaled_values_avx2(x + i + 8, factor, scale_values)), 16);
    // packus works within 128-bit lanes: [low 0-3, high 0-3, low 4-7, high 4-7], reordered.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(low, high), 0xd8));
  }
  // The tail counts from `full`, not on from the body's counter: inlined with a
  // constant n, GCC 12 took such a tail for one that overflows and warned.
  for (std::int64_t i = full; i < n; ++i) y[i] = float_to_bf16(scaled_value(x[i], scale));
}

__attribute__((target("avx2"))) inline void round_to_bf16_avx2(const float* x, std::int64_t n, float* y, float scale) {
  const bool scale_values = scale != 1.0f;
  const __m256 factor = _mm256_set1_ps(scale);
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_and_si256(
                                bf16_high_bits_avx2(scaled_values_avx2(x + i, factor, scale_values)), high_half)));
  for (; i < n; ++i) y[i] = round_to_bf16(scaled_value(x[i], scale));
}

/// bf16 to float, 8 lanes at a time: a zero extension and a shift, exact.
__attribute__((target("avx2"))) inline void bf16_to_float_avx2(const bf16* x, std::int64_t n, float* y) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))), 16)));
  for (; i < n; ++i) y[i] = bf16_to_float(x[i]);
}
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

/// y[i] = round_to_bf16(x[i] · scale), as to_bf16; y may be x.
inline void round_to_bf16(const float* x, std::int64_t n, float* y, float scale = 1.0f) {
#if defined(LDLM_HAVE_X86_KERNELS)
  if (cpu_features().avx512f) return detail::round_to_bf16_avx512(x, n, y, scale);
  if (cpu_features().avx2) return detail::round_to_bf16_avx2(x, n, y, scale);
#endif
  for (std::int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(detail::scaled_value(x[i], scale));
}

}  // namespace ldlm
