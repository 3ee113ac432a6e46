// Deterministic random numbers (core/random.hpp): the normal generator is reproducible and
// standard normal, and a grouped generator gives each group its solo sequence.
#include <gtest/gtest.h>

#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"

namespace ldlm {
namespace unit_core_random {
namespace {

TEST(RandomNormalGenerator, ReproducibleAndStandardNormal) {
  NormalGenerator a(42), b(42), c(43);
  std::vector<double> va(20000), vb(20000), vc(20000);
  a.fill(va.data(), 20000);
  b.fill(vb.data(), 20000);
  c.fill(vc.data(), 20000);
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  double mean = 0, var = 0;
  for (double v : va) mean += v;
  mean /= va.size();
  for (double v : va) var += (v - mean) * (v - mean);
  var /= va.size();
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(var, 1.0, 0.05);
}

// Groups of 1 and 3 rows (odd row sizes, so a Box-Muller spare crosses fills): each
// group's values over three fills are exactly its own generator's over fills of its rows.
TEST(RandomGroupedNormalGenerator, EachGroupDrawsItsSoloSequence) {
  const std::vector<NoiseGroup> groups{{1, 5}, {3, 8}};
  GroupedNormalGenerator grouped(groups);
  NormalGenerator first(5), second(8);
  constexpr Index kPerRow = 7;
  for (int fill = 0; fill < 3; ++fill) {
    std::vector<float> batch(4 * kPerRow), alone_first(kPerRow), alone_second(3 * kPerRow);
    grouped.fill(batch.data(), 4 * kPerRow);
    first.fill(alone_first.data(), kPerRow);
    second.fill(alone_second.data(), 3 * kPerRow);
    EXPECT_EQ(std::vector<float>(batch.begin(), batch.begin() + kPerRow), alone_first) << "fill " << fill;
    EXPECT_EQ(std::vector<float>(batch.begin() + kPerRow, batch.end()), alone_second) << "fill " << fill;
  }
  // One group is the plain generator.
  GroupedNormalGenerator one(42);
  NormalGenerator plain(42);
  std::vector<double> a(9), b(9);
  one.fill(a.data(), 9);
  plain.fill(b.data(), 9);
  EXPECT_EQ(a, b);
  std::vector<float> odd(9);
  EXPECT_THROW(grouped.fill(odd.data(), 9), InvalidArgument) << "9 values do not split into 4 rows";
  EXPECT_THROW(GroupedNormalGenerator(std::vector<NoiseGroup>{{0, 1}}), InvalidArgument);
}

}  // namespace
}  // namespace unit_core_random
}  // namespace ldlm
