// Parameter accounting (model/accounting.hpp, docs/model.md §Parameter accounting): the
// documented totals of ldlm-base, nothing allocated by construction, and the analytic table
// against the instantiated modules.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/files.hpp"
#include "support/reference.hpp"
#include "support/modules.hpp"

namespace unit_model_accounting {
namespace {

using namespace ldlm;
using ldlm::test::data_path;
using ldlm::test::small_config;

TEST(Accounting, DocumentedTotalsOfLdlmBase) {
  const Config base;
  const ParameterCounts total = count_parameters(base);
  EXPECT_EQ(total.trained, 306'011'162);
  EXPECT_EQ(total.frozen, 124'442'112);

  const LDLM<float> model(base);
  EXPECT_EQ(count_parameters(model.denoiser.output_layer.norm_final).trained, 768);
  EXPECT_EQ(count_parameters(model.denoiser.output_layer.norm_final).frozen, 0);

  const std::map<std::string, std::pair<std::int64_t, std::int64_t>> documented = {
      {"feature_model", {0, 124'441'344}}, {"encoder", {51'161'856, 0}},   {"latent_decoder", {55'097'882, 768}},
      {"token_decoder", {66'915'840, 0}},  {"denoiser", {132'835'584, 0}},
  };
  const auto table = parameter_table(model);
  ASSERT_EQ(table.size(), documented.size());
  for (const auto& row : table) {
    SCOPED_TRACE(row.module);
    ASSERT_TRUE(documented.count(row.module));
    EXPECT_EQ(row.counts.trained, documented.at(row.module).first);
    EXPECT_EQ(row.counts.frozen, documented.at(row.module).second);
  }
}

TEST(Accounting, ConstructingTheModelAllocatesNothing) {
  // Counting ldlm-base must not cost 1.7 GB: construction only records shapes.
  LDLM<float> model;
  std::int64_t visited = 0, allocated = 0;
  model.visit("", [&](const std::string& name, const auto& p) {
    ++visited;
    if (p.allocated()) {
      ++allocated;
      ADD_FAILURE() << name << " is allocated right after construction";
    }
  });
  EXPECT_GT(visited, 300);
  EXPECT_EQ(allocated, 0);
}

TEST(Accounting, AnalyticTableMatchesTheInstantiatedModules) {
  Config no_qk_norm;
  no_qk_norm.latent_attention_qk_norm = false;
  const std::vector<std::pair<std::string, Config>> configs = {
      {"ldlm-base", Config{}}, {"model_small", small_config()}, {"latent_attention_qk_norm=false", no_qk_norm}};
  for (const auto& [label, config] : configs) {
    SCOPED_TRACE(label);
    const auto analytic = analytic_parameter_table(config);
    const auto instantiated = parameter_table(LDLM<float>(config));
    ASSERT_EQ(analytic.size(), instantiated.size());
    for (std::size_t i = 0; i < analytic.size(); ++i) {
      SCOPED_TRACE(instantiated[i].module);
      EXPECT_EQ(analytic[i].module, instantiated[i].module);
      EXPECT_EQ(analytic[i].counts.trained, instantiated[i].counts.trained);
      EXPECT_EQ(analytic[i].counts.frozen, instantiated[i].counts.frozen);
    }
  }
  // The switch really removes the two per-layer qk gains of [head_dim] each.
  const auto with = count_parameters(Config{}), without = count_parameters(no_qk_norm);
  EXPECT_EQ(with.trained - without.trained, (6 + 6) * 2 * 64);
}

}  // namespace
}  // namespace unit_model_accounting
