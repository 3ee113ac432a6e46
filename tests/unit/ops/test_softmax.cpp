// The softmax rows of ops/softmax.hpp: every kernel against the definition in double, AVX2
// and AVX-512 agree, results independent of the row's address, NaN and far-below terms, and
// the bf16 probabilities with their padding.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"

namespace unit_ops_softmax {
namespace {

using ldlm::test::error_of;

using namespace ldlm;
using ldlm::test::random_matrix;
using ldlm::test::Tolerance;
using ::testing::HasSubstr;

// exp(capped(s) − max) against the same function in double. The result's relative
// error is the absolute error of the capped, shifted score, a few ulp of the
// row's largest |score| (up to 50 with softcap 50: about 3e-6), hence rtol 2e-5.
constexpr Tolerance kSoftmaxRowTol{1e-30, 2e-5};

std::vector<double> exp_shifted_capped_in_double(const std::vector<float>& scores, double cap, double scale) {
  std::vector<double> e(scores.size());
  double max = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < scores.size(); ++j) {
    const double s = scale * scores[j];
    e[j] = cap > 0 ? cap * std::tanh(s / cap) : s;
    max = std::max(max, e[j]);
  }
  for (double& v : e) v = std::exp(v - max);
  return e;
}

std::vector<float> random_scores(std::size_t n, float spread, std::uint64_t seed) {
  const Matrix<double> m = random_matrix(1, static_cast<Index>(n), seed, spread);
  return std::vector<float>(m.data(), m.data() + n);
}

/// Worst |got − ref| / (atol + rtol·|ref|) over the row, and the sum's.
template <class Kernel>
double worst_softmax_row_ratio(Kernel kernel, const std::vector<float>& scores, float cap) {
  std::vector<float> row = scores;
  const float sum = kernel(row.data(), static_cast<Index>(row.size()), cap);
  const std::vector<double> ref = exp_shifted_capped_in_double(scores, cap, 1.0);
  double ref_sum = 0, worst = 0;
  for (std::size_t j = 0; j < row.size(); ++j) {
    ref_sum += ref[j];
    worst = std::max(worst, std::abs(row[j] - ref[j]) / (kSoftmaxRowTol.atol + kSoftmaxRowTol.rtol * std::abs(ref[j])));
  }
  return std::max(worst, std::abs(sum - ref_sum) / (kSoftmaxRowTol.rtol * ref_sum));
}

using SoftmaxRowKernel = float (*)(float*, Index, float);

/// Every kernel of exp_shifted_capped this CPU can run.
std::vector<std::pair<const char*, SoftmaxRowKernel>> softmax_row_kernels() {
  std::vector<std::pair<const char*, SoftmaxRowKernel>> kernels = {
      {"generic", detail::exp_shifted_capped_generic<float>}};
#if defined(LDLM_HAVE_AVX512_SOFTMAX)
  if (cpu_features().avx512f && cpu_features().avx512dq)
    kernels.push_back({"avx512", detail::exp_shifted_capped_avx512});
  if (cpu_features().avx2 && cpu_features().fma) kernels.push_back({"avx2", detail::exp_shifted_capped_avx2});
#endif
  return kernels;
}

TEST(SoftmaxRow, EveryKernelMatchesTheDefinitionInDouble) {
  const auto kernels = softmax_row_kernels();
  std::uint64_t seed = 1;
  for (const auto& [name, kernel] : kernels)
    for (std::size_t n : {1, 2, 15, 16, 17, 31, 33, 100, 1023, 1024, 1025})
      // Spreads below and far above the cap: tanh's series and its exponential form.
      for (float spread : {0.5f, 8.0f, 300.0f})
        for (float cap : {0.0f, 50.0f, 1.0f}) {
          const double ratio = worst_softmax_row_ratio(kernel, random_scores(n, spread, ++seed), cap);
          EXPECT_LE(ratio, 1.0) << name << ": n = " << n << ", spread " << spread << ", cap " << cap;
        }
}

#if defined(LDLM_HAVE_AVX512_SOFTMAX)
// The AVX2 and AVX-512 kernels, one template on two vector types and two forms
// (softmax_simd::Form), agree with each other on a CPU that runs both, element by
// element and in the sum: each is within kSoftmaxRowTol of the definition, so twice
// that bounds their difference. (Planted: the fewer_multiplies form without the sign
// of tanh in its large lanes; fails.)
TEST(SoftmaxRow, Avx2AndAvx512KernelsAgree) {
  if (!(cpu_features().avx512f && cpu_features().avx512dq && cpu_features().avx2 && cpu_features().fma))
    GTEST_SKIP() << "this CPU does not run both kernels";
  const Tolerance both{2 * kSoftmaxRowTol.atol, 2 * kSoftmaxRowTol.rtol};
  std::uint64_t seed = 100;
  for (std::size_t n : {1, 7, 15, 16, 17, 31, 33, 100, 1025})
    for (float spread : {0.5f, 8.0f, 300.0f})
      for (float cap : {0.0f, 50.0f, 1.0f}) {
        const std::vector<float> scores = random_scores(n, spread, ++seed);
        std::vector<float> wide = scores, narrow = scores;
        const float wide_sum = detail::exp_shifted_capped_avx512(wide.data(), static_cast<Index>(n), cap);
        const float narrow_sum = detail::exp_shifted_capped_avx2(narrow.data(), static_cast<Index>(n), cap);
        const std::string where =
            "n = " + std::to_string(n) + ", spread " + std::to_string(spread) + ", cap " + std::to_string(cap);
        EXPECT_LE(std::abs(wide_sum - narrow_sum), both.allowed(narrow_sum)) << where << ": sums";
        for (std::size_t j = 0; j < n; ++j)
          ASSERT_LE(std::abs(wide[j] - narrow[j]), both.allowed(narrow[j]))
              << where << ": j = " << j << ", avx512 " << wide[j] << ", avx2 " << narrow[j];
      }
}
#endif

// Every kernel, and the one exp_shifted_capped picks. (Planted: the generic kernel
// in Eigen's vector expressions, built with -mavx2, fails at 14 of 15 offsets.)
TEST(SoftmaxRow, ResultDoesNotDependOnTheRowsAddress) {
  auto kernels = softmax_row_kernels();
  kernels.push_back({"dispatched", exp_shifted_capped<float>});
  const std::vector<float> scores = random_scores(1000, 20.0f, 7);
  for (const auto& [name, kernel] : kernels) {
    std::vector<float> first;
    for (std::size_t offset = 0; offset < 16; ++offset) {
      std::vector<float> buffer(offset + scores.size());
      std::copy(scores.begin(), scores.end(), buffer.begin() + static_cast<std::ptrdiff_t>(offset));
      kernel(buffer.data() + offset, static_cast<Index>(scores.size()), 50.0f);
      const std::vector<float> row(buffer.begin() + static_cast<std::ptrdiff_t>(offset), buffer.end());
      if (offset == 0)
        first = row;
      else
        EXPECT_TRUE(row == first) << name << ": offset " << offset << " floats";
    }
  }
}

TEST(SoftmaxRow, NanScoreMakesTheSumNanAsTheDefinitionDoes) {
  for (float cap : {0.0f, 50.0f}) {
    std::vector<float> row = random_scores(40, 4.0f, 3);
    row[21] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(exp_shifted_capped(row.data(), 40, cap))) << "cap " << cap;
    EXPECT_TRUE(std::isnan(row[21]));
  }
  // An infinite score is capped to ±cap.
  std::vector<float> row = {std::numeric_limits<float>::infinity(), 0.0f, -std::numeric_limits<float>::infinity()};
  EXPECT_NEAR(exp_shifted_capped(row.data(), 3, 50.0f), 1.0 + std::exp(-50.0) + std::exp(-100.0), 1e-6);
  EXPECT_EQ(row[0], 1.0f);
}

// Terms far below the row's maximum are zero on every kernel, in the vector body
// and in the tail: the generic and AVX-512 kernels round e^-104 and below to zero,
// the AVX2 one flushes everything below 2^-125 (e^-86.6). (Planted: the AVX2 kernel
// without its flush, which leaves 2^-125 in each such lane; fails.)
TEST(SoftmaxRow, TermsFarBelowTheMaximumAreZero) {
  for (const auto& [name, kernel] : softmax_row_kernels()) {
    std::vector<float> row(45, -200.0f);  // 32 in the body, a tail of 13 over both halves
    row[5] = 0.0f;
    row[20] = -1000.0f;
    row[33] = -std::numeric_limits<float>::infinity();
    row[42] = -1000.0f;
    EXPECT_EQ(kernel(row.data(), 45, 0.0f), 1.0f) << name;
    for (std::size_t j = 0; j < row.size(); ++j) EXPECT_EQ(row[j], j == 5 ? 1.0f : 0.0f) << name << ": j = " << j;
  }
}

#if defined(LDLM_HAVE_AVX512_SOFTMAX)
// The softmax row of bf16 attention on AMX: probabilities e_j / Σ rounded to bf16,
// against the definition in double. Rounding to bf16's 8 significant bits moves a
// value by up to 2^-8 of itself, and the float is within a few ulp of the exponent
// of the true value: up to 2 · c · log2 e with softcap c (c ≤ 100 here), and
// |scale · s · log2 e| up to about 430 without a cap at spread 300, at most about
// 1e-5: rtol 2^-8 + 2e-5. atol covers probabilities that underflow (below 1e-38,
// flushed to zero by the instruction). Caps up to 64 take the kernel's path without a
// shift by the row's maximum, larger ones (and none) the shifted path: 64 sits below,
// 88 and 100 above (unshifted, a row of e^±88 or e^±100 would overflow or underflow).
constexpr Tolerance kBf16ProbabilityTol{1e-37, 1.0 / 256 + 2e-5};

TEST(SoftmaxRow, Bf16ProbabilitiesMatchTheDefinitionInDoubleAndPadWithZeros) {
  const CpuFeatures& cpu = cpu_features();
  if (!(cpu.avx512f && cpu.avx512dq && cpu.avx512bw && cpu.avx512_bf16)) GTEST_SKIP() << "needs AVX512_BF16";
  std::uint64_t seed = 100;
  for (Index n : {1, 15, 16, 17, 31, 32, 33, 100, 1000, 1024})
    for (float spread : {0.5f, 8.0f, 300.0f})
      for (float cap : {0.0f, 50.0f, 1.0f, 64.0f, 88.0f, 100.0f})
        for (float scale : {1.0f, 0.125f, 0.3f}) {
          const std::vector<float> scores = random_scores(static_cast<std::size_t>(n), spread, ++seed);
          // AMX's padding (whole blocks of 32, one beyond the rounding) alternates with
          // the oneDNN path's (none, or a causal row's keys up to its tile's last).
          const Index padded = seed % 2 ? (n + 31) / 32 * 32 + 32 : n + seed % 3 * 7;
          std::vector<float> row = scores;
          // Sentinels past `padded`: the row's last store is masked, not rounded up to 32.
          std::vector<bf16> p(static_cast<std::size_t>(padded + 40), float_to_bf16(7.0f));
          detail::softmax_row_to_bf16_avx512(row.data(), n, padded, scale, cap, p.data());
          const std::vector<double> e = exp_shifted_capped_in_double(scores, cap, scale);
          double sum = 0;
          for (double v : e) sum += v;
          double worst = 0;
          Index worst_at = 0;
          for (Index j = 0; j < n; ++j) {
            const double ref = e[static_cast<std::size_t>(j)] / sum;
            const double ratio = std::abs(bf16_to_float(p[static_cast<std::size_t>(j)]) - ref) /
                                 (kBf16ProbabilityTol.atol + kBf16ProbabilityTol.rtol * ref);
            if (ratio > worst) worst = ratio, worst_at = j;
          }
          EXPECT_LE(worst, 1.0) << "n = " << n << ", spread " << spread << ", cap " << cap << ", scale " << scale
                                << ": worst at " << worst_at << ", got "
                                << bf16_to_float(p[static_cast<std::size_t>(worst_at)]) << ", reference "
                                << e[static_cast<std::size_t>(worst_at)] / sum;
          for (Index j = n; j < padded; ++j)
            ASSERT_EQ(bf16_to_float(p[static_cast<std::size_t>(j)]), 0.0f) << "n = " << n << ", padding at " << j;
          for (Index j = padded; j < padded + 40; ++j)
            ASSERT_EQ(bf16_to_float(p[static_cast<std::size_t>(j)]), 7.0f)
                << "n = " << n << ", padded " << padded << ": wrote past the padding at " << j;
        }
}

// Without the shift, a row whose every score is capped near ±c has exponentials near
// e^±c. For c ≤ 64 those are normal floats and 4096 of them sum without overflow, so
// the row is still a softmax, not 0 / 0 or ∞ / ∞. At and above the threshold.
TEST(SoftmaxRow, Bf16ProbabilitiesOfARowCappedNearTheCapAreUniform) {
  const CpuFeatures& cpu = cpu_features();
  if (!(cpu.avx512f && cpu.avx512dq && cpu.avx512bw && cpu.avx512_bf16)) GTEST_SKIP() << "needs AVX512_BF16";
  for (float cap : {50.0f, 64.0f, 88.0f, 100.0f})
    for (float score : {-1e6f, 1e6f}) {
      std::vector<float> row(4096, score);
      std::vector<bf16> p(4096);
      detail::softmax_row_to_bf16_avx512(row.data(), 4096, 4096, 1.0f, cap, p.data());
      for (Index j = 0; j < 4096; ++j)
        ASSERT_EQ(bf16_to_float(p[static_cast<std::size_t>(j)]), 1.0f / 4096)
            << "cap " << cap << ", every score " << score << ", key " << j;
    }
}

TEST(SoftmaxRow, Bf16ProbabilitiesRejectARowThatDoesNotFitItsPadding) {
  const CpuFeatures& cpu = cpu_features();
  if (!(cpu.avx512f && cpu.avx512dq && cpu.avx512bw && cpu.avx512_bf16)) GTEST_SKIP() << "needs AVX512_BF16";
  std::vector<float> row(64, 1.0f);
  std::vector<bf16> p(64);
  EXPECT_THAT(
      error_of<InvalidArgument>([&] { detail::softmax_row_to_bf16_avx512(row.data(), 0, 32, 1, 0, p.data()); }),
      HasSubstr("needs 1 <= visible <= padded; got visible 0, padded 32"));
  EXPECT_THAT(
      error_of<InvalidArgument>([&] { detail::softmax_row_to_bf16_avx512(row.data(), 40, 39, 1, 0, p.data()); }),
      HasSubstr("got visible 40, padded 39"));
}

TEST(SoftmaxRow, Bf16ProbabilitiesOfARowWithANanAreNan) {
  const CpuFeatures& cpu = cpu_features();
  if (!(cpu.avx512f && cpu.avx512dq && cpu.avx512bw && cpu.avx512_bf16)) GTEST_SKIP() << "needs AVX512_BF16";
  for (float cap : {0.0f, 50.0f}) {
    std::vector<float> row = random_scores(40, 4.0f, 3);
    row[21] = std::numeric_limits<float>::quiet_NaN();
    std::vector<bf16> p(64);
    detail::softmax_row_to_bf16_avx512(row.data(), 40, 64, 0.125f, cap, p.data());
    EXPECT_TRUE(std::isnan(bf16_to_float(p[0]))) << "cap " << cap;
    EXPECT_TRUE(std::isnan(bf16_to_float(p[39]))) << "cap " << cap;
  }
}
#endif

}  // namespace
}  // namespace unit_ops_softmax
