// Size arithmetic of core/tensor.hpp: overflow-checked products at their boundaries.
#include <gtest/gtest.h>

#include <limits>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"

namespace unit_core_tensor {
namespace {

using namespace ldlm;

TEST(Tensor, CheckedProductBoundaries) {
  constexpr Index kMax = std::numeric_limits<Index>::max();
  EXPECT_EQ(checked_product<Index>({Index{1} << 31, Index{1} << 31}), Index{1} << 62);
  EXPECT_EQ(checked_product<Index>({Index{1} << 31, Index{1} << 31, 2}), std::nullopt);
  EXPECT_EQ(checked_product<Index>({kMax, 1}), kMax);
  EXPECT_EQ(checked_product<Index>({0, kMax, kMax}), 0);
  EXPECT_EQ(checked_product<Index>({Index{1} << 32, Index{1} << 31}), std::nullopt);
  EXPECT_EQ(checked_product<Index>({kMax / 2 + 1, 2}), std::nullopt);
  EXPECT_EQ(checked_product<Index>({-1, 5}), std::nullopt);
  EXPECT_EQ(checked_product<Index>({}), 1);
  constexpr std::size_t kSizeMax = std::numeric_limits<std::size_t>::max();
  EXPECT_EQ(checked_product<std::size_t>({kSizeMax / 4, 4}), kSizeMax / 4 * 4);
  EXPECT_EQ(checked_product<std::size_t>({kSizeMax / 4 + 1, 4}), std::nullopt);
}

}  // namespace
}  // namespace unit_core_tensor
