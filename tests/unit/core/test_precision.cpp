// bf16 and fp16 values (core/precision.hpp): the vector conversions equal the scalar
// round-to-nearest-even (torch's `.to(torch.bfloat16)`) bit for bit, every half and bf16
// widens exactly, and the precisions' names. Conversions are checked bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/modules.hpp"
#include "support/reference.hpp"

namespace unit_core_precision {
namespace {

using namespace ldlm;
using ::testing::HasSubstr;

TEST(PrecisionBf16, VectorPathEqualsScalarRoundingBitForBit) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          1.00390625f /* tie, even */,
                          1.01171875f /* tie, odd */,
                          3.0e38f,
                          -3.4e38f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          1.0e-39f,
                          -2.5e-40f,
                          std::numeric_limits<float>::max()};
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 4000; ++i) x.push_back(std::bit_cast<float>(bits(rng)));
  // The dispatched conversions, and each vector kernel this CPU has.
  using ToBf16 = void (*)(const float*, std::int64_t, bf16*, float);
  using RoundToBf16 = void (*)(const float*, std::int64_t, float*, float);
  std::vector<std::tuple<const char*, ToBf16, RoundToBf16>> kernels = {{"dispatched", to_bf16, round_to_bf16}};
#if defined(LDLM_HAVE_X86_KERNELS)
  if (cpu_features().avx2) kernels.emplace_back("avx2", detail::to_bf16_avx2, detail::round_to_bf16_avx2);
  if (cpu_features().avx512bw) kernels.emplace_back("avx512", detail::to_bf16_avx512, detail::round_to_bf16_avx512);
#endif
  for (const auto& [name, convert, round] : kernels) {
    std::vector<bf16> vec(x.size());
    convert(x.data(), static_cast<std::int64_t>(x.size()), vec.data(), 1.0f);
    std::vector<float> rounded(x.size());
    round(x.data(), static_cast<std::int64_t>(x.size()), rounded.data(), 1.0f);
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(static_cast<std::uint16_t>(vec[i]), static_cast<std::uint16_t>(float_to_bf16(x[i])))
          << name << ": x = " << x[i] << " (bits " << std::hex << std::bit_cast<std::uint32_t>(x[i]) << ")";
      ASSERT_EQ(std::bit_cast<std::uint32_t>(rounded[i]), std::bit_cast<std::uint32_t>(round_to_bf16(x[i])))
          << name << ": " << i;
    }
  }
  // And back: every bf16 widens to the float of its 16 bits (array form, and AVX2's).
  std::vector<bf16> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = bf16(static_cast<std::uint16_t>(i));
  std::vector<std::pair<const char*, void (*)(const bf16*, std::int64_t, float*)>> wideners = {
      {"dispatched", bf16_to_float}};
#if defined(LDLM_HAVE_X86_KERNELS)
  if (cpu_features().avx2) wideners.emplace_back("avx2", detail::bf16_to_float_avx2);
#endif
  for (const auto& [name, widen] : wideners) {
    std::vector<float> wide(all.size() + 3);
    widen(all.data() + 3, static_cast<std::int64_t>(all.size() - 3), wide.data());  // an odd start and a tail
    for (std::size_t i = 3; i < all.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(wide[i - 3]), std::uint32_t(i) << 16) << name << ": bf16 bits " << i;
  }
  // Round to nearest, ties to even; NaN stays NaN; subnormals are kept, not flushed.
  EXPECT_EQ(static_cast<std::uint16_t>(float_to_bf16(1.00390625f)), 0x3f80);  // 1 + 2^-8 ties down to 1
  EXPECT_EQ(static_cast<std::uint16_t>(float_to_bf16(1.01171875f)), 0x3f82);  // 1 + 3·2^-8 ties up
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_NE(round_to_bf16(1.0e-39f), 0.0f);
  EXPECT_EQ(static_cast<std::uint16_t>(float_to_bf16(3.4e38f)), 0x7f80);  // beyond bf16's max: infinity
}

/// Values x whose product x · scale in fp32 lies exactly halfway between two bf16
/// values while the exact product does not, on the side away from the even one: a
/// conversion that skipped the fp32 rounding of the product would round them the
/// other way.
std::vector<float> fp32_ties_of_products(float scale, std::size_t count) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(1.0f, 2.0f);
  std::vector<float> ties;
  for (int attempt = 0; attempt < 50'000'000 && ties.size() < count; ++attempt) {
    const float x = value(rng), product = x * scale;
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(product);
    const double exact = static_cast<double>(x) * static_cast<double>(scale);
    if ((bits & 0xffffu) != 0x8000u || exact == static_cast<double>(product)) continue;
    const std::uint16_t rounded_from_exact = static_cast<std::uint16_t>((bits >> 16) + (exact > product ? 1 : 0));
    if (rounded_from_exact != static_cast<std::uint16_t>(float_to_bf16(product))) ties.push_back(x);
  }
  return ties;
}

TEST(PrecisionNarrowFloats, EveryHalfAndBf16WidensExactly) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const int sign = (bits >> 15) ? -1 : 1, exp = (bits >> 10) & 0x1f, mant = bits & 0x3ff;
    const float got = half_to_float(std::uint16_t(bits));
    ASSERT_EQ(std::signbit(got), sign < 0) << "half bits " << bits;
    if (exp == 0x1f) {  // infinities, and NaNs with their payload in the top of the float's mantissa
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got), (bits & 0x8000u) << 16 | 0x7f800000u | std::uint32_t(mant) << 13)
          << "half bits " << bits;
      continue;
    }
    const double want = sign * (exp ? std::ldexp(1.0 + mant / 1024.0, exp - 15) : std::ldexp(double(mant), -24));
    ASSERT_EQ(double(got), want) << "half bits " << bits;
  }
  // bf16 is the top half of a float: every value, one at a time (the array form above
  // takes the vector path for all but its tail).
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(bf16_to_float(bf16(static_cast<std::uint16_t>(bits)))), bits << 16)
        << "bf16 bits " << bits;
}

TEST(PrecisionBf16, ScaledConversionRoundsTheFp32Product) {
  // Attention normalises its probabilities inside the conversion: x · scale must be
  // rounded to fp32 first, exactly as a separate multiply would, in both halves of a
  // 32-lane block, in the 16-lane step and in the scalar tail.
  constexpr float kThird = 1.0f / 3.0f;
  const std::vector<float> ties = fp32_ties_of_products(kThird, 16);
  ASSERT_EQ(ties.size(), 16u);
  const float kInf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {-0.0f,
                                      0.0f,
                                      std::numeric_limits<float>::max(),
                                      3.0e38f,
                                      -3.0e38f,
                                      1.0e-39f,
                                      -2.5e-40f,
                                      std::numeric_limits<float>::quiet_NaN(),
                                      kInf,
                                      -kInf,
                                      1.00390625f,
                                      1.01171875f,
                                      2.0078125f,
                                      1.0e-38f,
                                      -1.5f,
                                      65504.0f};
  std::vector<float> x;
  for (const std::vector<float>* part : {&special, &ties, &ties, &special})
    x.insert(x.end(), part->begin(), part->end());
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  for (int i = 0; i < 992; ++i) x.push_back(value(rng));
  x.insert(x.end(), special.begin(), special.end());  // the 16-lane step
  x.insert(x.end(), ties.begin(), ties.begin() + 7);  // the scalar tail
  ASSERT_EQ(x.size() % 32, 23u);

  for (const float scale : {1.0f, kThird, 0.5f, 1.5f, 7.5e-4f}) {
    std::vector<bf16> converted(x.size());
    std::vector<float> rounded(x.size());
    to_bf16(x.data(), static_cast<std::int64_t>(x.size()), converted.data(), scale);
    round_to_bf16(x.data(), static_cast<std::int64_t>(x.size()), rounded.data(), scale);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float product = x[i] * scale;
      ASSERT_EQ(static_cast<std::uint16_t>(converted[i]), static_cast<std::uint16_t>(float_to_bf16(product)))
          << "x = " << x[i] << ", scale = " << scale << ", index " << i;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(rounded[i]), std::bit_cast<std::uint32_t>(round_to_bf16(product)))
          << "x = " << x[i] << ", scale = " << scale << ", index " << i;
    }
  }
}

TEST(PrecisionBf16, PrecisionNames) {
  EXPECT_EQ(parse_precision("bf16"), Precision::bf16);
  EXPECT_EQ(parse_precision("fp32"), Precision::fp32);
  EXPECT_THAT(ldlm::test::error_of<InvalidArgument>([] { parse_precision("fp16", "--precision"); }),
              HasSubstr("--precision: expected 'fp32', 'bf16' or 'int8', got 'fp16'"));
}

}  // namespace
}  // namespace unit_core_precision
