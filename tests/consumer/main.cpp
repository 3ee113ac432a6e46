// Downstream smoke test: the whole library compiles from a foreign project and
// the ldlm-base parameter totals of the specification come out.
#include <ldlm/ldlm.hpp>

int main() {
  ldlm::ParameterCounts c = ldlm::count_parameters(ldlm::Config{});
  return (c.trained == 306011162 && c.frozen == 124442112) ? 0 : 1;
}
