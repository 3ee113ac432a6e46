// Test support: the tangent schedule of docs/model.md §Noise schedule in long double,
// written independently of sampling/schedule.hpp (test_schedule.cpp holds the schedule
// to it, test_solvers.cpp computes Euler steps by hand with it).
#pragma once

#include <cmath>

namespace ldlm::test {

inline constexpr long double kPi = 3.141592653589793238462643383279502884L;

inline long double ref_alpha(long double t, long double D) {
  const long double tan = std::tan(kPi * t / 2);
  return 1.0L / std::sqrt(1.0L + D * D * tan * tan);
}
inline long double ref_sigma(long double t, long double D) {
  const long double a = ref_alpha(t, D);
  return std::sqrt(1.0L - a * a);
}
inline long double ref_beta(long double t, long double D, long double clip) {
  const long double tc = t < clip ? t : clip;
  const long double tan = std::tan(kPi * tc / 2);
  return kPi * D * D * tan * (1.0L + tan * tan) / (1.0L + D * D * tan * tan);
}

}  // namespace ldlm::test
