// Deterministic random numbers (core/random.hpp): the normal generator is reproducible and
// standard normal.
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

}  // namespace
}  // namespace unit_core_random
}  // namespace ldlm
