// The command line of the evaluation programs in bench/ (ldlm_sampler_eval, ldlm_infill_eval):
// "--name value" pairs and comma-separated lists.
#pragma once

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

}  // namespace ldlm::bench
