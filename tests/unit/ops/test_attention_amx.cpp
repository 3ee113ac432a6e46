// The AMX attention's operand tiles (ops/attention_amx.hpp) hold the documented pairs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"

namespace unit_ops_attention_amx {
namespace {

using namespace ldlm;

// The packing of the AMX attention kernel against the layout its header documents,
// on any CPU. Every value (128 + d) · 2^(t − 16) is exact in bf16 and distinct, so
// a misplaced or transposed element shows.
float distinct_value(Index t, Index d) { return std::ldexp(128.0f + static_cast<float>(d), static_cast<int>(t) - 16); }

TEST(AttentionAmx, KeyAndValueTilesHoldTheDocumentedPairs) {
  constexpr Index hd = 64, ld = hd + 8;  // rows of a wider buffer, as q | k | v are
  std::vector<float> x(static_cast<std::size_t>(32 * ld));
  for (Index t = 0; t < 32; ++t)
    for (Index d = 0; d < hd; ++d) x[static_cast<std::size_t>(t * ld + d)] = distinct_value(t, d);
  // Element (r, n, e) of every tile against the source value (row, column) it must hold.
  auto expect_tiles = [&](const char* what, const std::vector<bf16>& tiles, Index count, auto source) {
    for (Index tile = 0; tile < static_cast<Index>(tiles.size()) / 512; ++tile)
      for (Index r = 0; r < 16; ++r)
        for (Index n = 0; n < 16; ++n)
          for (Index e = 0; e < 2; ++e) {
            const auto [t, d] = source(tile, r, n, e);
            ASSERT_EQ(bf16_to_float(tiles[static_cast<std::size_t>(tile * 512 + r * 32 + 2 * n + e)]),
                      t < count ? distinct_value(t, d) : 0.0f)
                << what << " tile " << tile << ", element (" << r << ", " << n << ", " << e << ")";
          }
  };

  constexpr Index key_count = 13, value_count = 29;  // the rest of each block is zero
  std::vector<bf16> keys(static_cast<std::size_t>(16 * hd), float_to_bf16(7.0f));
  detail::amx::pack_key_block(x.data(), ld, key_count, hd, keys.data());
  expect_tiles("key", keys, key_count, [](Index c, Index r, Index n, Index e) {
    return std::pair{n, 32 * c + 2 * r + e};  // key n, depth 32c + 2r + e
  });
  std::vector<bf16> values(static_cast<std::size_t>(32 * hd), float_to_bf16(7.0f));
  detail::amx::pack_value_block(x.data(), ld, value_count, hd, values.data());
  expect_tiles("value", values, value_count, [](Index ct, Index r, Index n, Index e) {
    return std::pair{2 * r + e, 16 * ct + n};  // value 2r + e, column 16ct + n
  });
}

}  // namespace
}  // namespace unit_ops_attention_amx
