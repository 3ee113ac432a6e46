// The command line of the research programs (ldlm_sampler_eval, ldlm_infill_eval,
// ldlm_fit_time_grid, ldlm_solver_variants): "--name value" pairs, comma-separated lists
// and seed ranges.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace ldlm::bench {

/// The non-empty fields of `s` between separators.
inline std::vector<std::string> split(const std::string& s, char separator = ',') {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string field; std::getline(in, field, separator);)
    if (!field.empty()) out.push_back(field);
  return out;
}

/// The value after "--name" in `argv`, or `fallback`.
inline std::string arg(const std::vector<std::string>& argv, const std::string& name, const std::string& fallback) {
  for (std::size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--" + name) return argv[i + 1];
  return fallback;
}

/// "100-131" or "0,3,5" as a list of seeds.
inline std::vector<std::uint64_t> seed_list(const std::string& text) {
  std::vector<std::uint64_t> out;
  for (const std::string& field : split(text)) {
    const auto dash = field.find('-');
    const std::uint64_t a = std::stoull(field.substr(0, dash));
    const std::uint64_t b = dash == std::string::npos ? a : std::stoull(field.substr(dash + 1));
    for (std::uint64_t s = a; s <= b; ++s) out.push_back(s);
  }
  return out;
}

}  // namespace ldlm::bench
