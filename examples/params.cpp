// Prints the parameter table of ldlm-base, or of the configuration JSON given as
// argv[1]: one row per module (trained, frozen), then the totals. Counting needs only
// the shapes, so nothing is allocated. Exits non-zero if the instantiated modules
// disagree with the closed-form counts.
#include <cstdio>
#include <exception>

#include "ldlm/ldlm.hpp"

int main(int argc, char** argv) try {
  const ldlm::Config config = argc > 1 ? ldlm::Config::load(argv[1]) : ldlm::Config{};
  const ldlm::LDLM<float> model(config);
  std::printf("%-16s %14s %14s\n", "module", "trained", "frozen");
  for (const auto& row : ldlm::parameter_table(model))
    std::printf("%-16s %14lld %14lld\n", row.module.c_str(), static_cast<long long>(row.counts.trained),
                static_cast<long long>(row.counts.frozen));
  const ldlm::ParameterCounts total = ldlm::count_parameters(model);
  std::printf("%-16s %14lld %14lld\n", "total", static_cast<long long>(total.trained),
              static_cast<long long>(total.frozen));

  if (ldlm::analytic_parameter_table(config) != ldlm::parameter_table(model)) {
    std::fprintf(stderr, "params: the closed-form counts disagree with the instantiated modules\n");
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "params: %s\n", e.what());
  return 2;
}
