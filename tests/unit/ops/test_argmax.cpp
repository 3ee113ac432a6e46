// argmax_rows (ops/argmax.hpp) treats NaN as the maximum, like torch.argmax.
#include <gtest/gtest.h>

#include <limits>
#include <utility>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"

namespace ldlm {
namespace unit_ops_argmax {
namespace {

// torch.argmax treats NaN as the maximum: the first NaN of a row wins, and ties
// otherwise go to the lowest index. Every expected id below is what torch 1.13
// (Debian python3-torch) returns for the same row, torch.argmax(row, dim=-1).
template <class S>
void check_argmax_matches_torch() {
  const S nan = std::numeric_limits<S>::quiet_NaN(), inf = std::numeric_limits<S>::infinity();
  const std::vector<std::pair<std::vector<S>, std::int64_t>> rows = {
      {{1, nan, 3, nan}, 1},    {{nan, 1, 2, 0}, 0},           {{1, 2, 0, nan}, 3}, {{inf, nan, 0, 0}, 1},
      {{nan, nan, 0, 0}, 0},    {{-inf, -inf, -inf, -inf}, 0}, {{1, 3, 3, 0}, 1},   {{-inf, nan, inf, 0}, 1},
      {{-0.0, 0.0, -1, -2}, 0}, {{-5, -1, -1, -7}, 1}};
  Matrix<S> logits(static_cast<Index>(rows.size()), 4);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (Index v = 0; v < 4; ++v) logits(static_cast<Index>(r), v) = rows[r].first[std::size_t(v)];
  std::vector<std::int64_t> ids(rows.size(), -1);
  argmax_rows<S>(logits, ids.data());
  for (std::size_t r = 0; r < rows.size(); ++r)
    EXPECT_EQ(ids[r], rows[r].second) << "row " << r << ": " << logits.row(Index(r));
}

TEST(Argmax, ArgmaxTreatsNanAsTheMaximumLikeTorch) {
  check_argmax_matches_torch<float>();
  check_argmax_matches_torch<double>();
}

}  // namespace
}  // namespace unit_ops_argmax
}  // namespace ldlm
