// ldlm params: parameter counts per module and the totals.
#pragma once

#include "common.hpp"

namespace ldlm::cli {

/// The parameter table as text: a row per module (trained, frozen), the totals and
/// the denoiser's final LayerNorm, the figures docs/model.md §Parameter accounting
/// documents.
template <class S>
std::string parameter_table_text(const LDLM<S>& m) {
  char line[96];
  std::string text;
  const auto add = [&](const char* label, std::int64_t trained, std::optional<std::int64_t> frozen = {}) {
    if (frozen)
      std::snprintf(line, sizeof line, "%-26s %14lld %14lld\n", label, static_cast<long long>(trained),
                    static_cast<long long>(*frozen));
    else
      std::snprintf(line, sizeof line, "%-26s %14lld\n", label, static_cast<long long>(trained));
    text += line;
  };
  std::snprintf(line, sizeof line, "%-26s %14s %14s\n", "module", "trained", "frozen");
  text += line;
  for (const auto& row : parameter_table(m)) add(row.module.c_str(), row.counts.trained, row.counts.frozen);
  const ParameterCounts total = count_parameters(m);
  add("trained total", total.trained);
  add("frozen total", total.frozen);
  add("denoiser final LayerNorm", count_parameters(m.denoiser.output_layer.norm_final).total());
  return text;
}

const Command kParams{"params",
                      "parameter counts per module and the totals",
                      "",
                      "Print the trained and frozen parameter counts of every module, then the totals\n"
                      "(nothing is allocated).",
                      {kConfigOption, text_option("weights", "W.safetensors", &ModelOptions::weights,
                                                  "count the model whose configuration this file stores")},
                      ""};

int run_params(const Args& args) {
  args.expect_positionals(0, 0);
  const ModelOptions options = args.read<ModelOptions>();
  const auto weights = open_weights(options);
  std::fputs(parameter_table_text(LDLM<float>(load_config(options, weights))).c_str(), stdout);
  return 0;
}

}  // namespace ldlm::cli
