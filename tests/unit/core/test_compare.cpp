// The tolerance check that every parity test and `ldlm compare` rely on
// (core/compare.hpp): a check that passed NaNs or infinite errors would let any of
// those tests pass on a broken result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "ldlm/core/compare.hpp"

namespace unit_core_compare {
namespace {

using ldlm::compare_values;
using ldlm::Comparison;
using ldlm::Tolerance;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Comparison compare(const std::vector<double>& got, const std::vector<double>& ref, Tolerance tol = {}) {
  return compare_values(got.data(), ref.data(), static_cast<std::int64_t>(ref.size()), tol);
}

TEST(Compare, BoundIsAtolPlusRtolTimesReference) {
  const Tolerance tol{0.5, 0.25};
  EXPECT_TRUE(compare({4.5}, {4.0}, tol).ok());   // error 0.5 < 0.5 + 1.0
  EXPECT_TRUE(compare({5.5}, {4.0}, tol).ok());   // error 1.5 = the bound
  EXPECT_FALSE(compare({5.6}, {4.0}, tol).ok());  // error 1.6 > the bound
}

TEST(Compare, ReportsTheElementFurthestOutsideItsBound) {
  const Comparison c = compare({1.0, 2.5, 40.0, 7.0}, {1.0, 2.0, 39.0, 7.0}, {0.1, 0.0});
  EXPECT_EQ(c.failures, 2);
  EXPECT_EQ(c.max_error, 1.0);
  EXPECT_EQ(c.worst, 2) << "40 misses its bound by 0.9, 2.5 only by 0.4";
  EXPECT_EQ(std::pair(c.worst_got, c.worst_ref), std::pair(40.0, 39.0));
}

TEST(Compare, NaNsAndInfinitiesAgreeOnlyWithThemselves) {
  EXPECT_TRUE(compare({kNaN, kInf, -kInf}, {kNaN, kInf, -kInf}).ok());
  EXPECT_EQ(compare({kNaN, kInf, -kInf}, {kNaN, kInf, -kInf}).max_error, 0.0);
  // A NaN against a number, and a number against an infinite reference, where the
  // bound atol + rtol·|ref| is infinite too.
  for (const auto& [got, ref] :
       {std::pair{kNaN, 1.0}, std::pair{1.0, kNaN}, std::pair{1.0, kInf}, std::pair{kInf, -kInf}}) {
    const Comparison c = compare({0.0, got}, {0.0, ref});
    EXPECT_EQ(c.failures, 1) << got << " against " << ref;
    EXPECT_EQ(c.worst, 1) << got << " against " << ref;
    EXPECT_EQ(c.max_error, kInf) << got << " against " << ref;
  }
}

TEST(Compare, IndexStringIsTheRowMajorMultiIndex) {
  EXPECT_EQ(ldlm::index_string(0, {2, 3, 4}), "[0, 0, 0]");
  EXPECT_EQ(ldlm::index_string(23, {2, 3, 4}), "[1, 2, 3]");
  EXPECT_EQ(ldlm::index_string(13, {2, 3, 4}), "[1, 0, 1]");
}

}  // namespace
}  // namespace unit_core_compare
