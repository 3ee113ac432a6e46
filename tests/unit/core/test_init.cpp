// The deterministic parameter generator (core/init.hpp) reproduces the Python generator's
// weights bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "ldlm/ldlm.hpp"
#include "support/files.hpp"
#include "support/reference.hpp"
#include "support/modules.hpp"

namespace unit_core_init {
namespace {

using namespace ldlm;
using ldlm::test::data_path;
using ldlm::test::open_reference;
using ldlm::test::small_config;

TEST(Init, GeneratedWeightsEqualTheCommittedSeed1Weights) {
  // model_small/weights.safetensors was written by the Python generator with seed 1:
  // the C++ generator must reproduce it bit for bit.
  LDLM<float> generated(small_config());
  init_parameters(generated, 1, "", /*pack=*/std::nullopt);
  const auto file = open_reference("model_small/weights.safetensors");
  std::int64_t compared = 0;
  visit_parameters(generated, "", [&](const std::string& name, const auto& p) {
    const auto want = file.read<float>(name);
    ASSERT_EQ(std::int64_t(want.size()), p.numel()) << name;
    EXPECT_EQ(std::memcmp(want.data(), p.data(), want.size() * sizeof(float)), 0) << name;
    ++compared;
  });
  EXPECT_EQ(compared, std::int64_t(file.tensors().size()));
}

}  // namespace
}  // namespace unit_core_init
