// A small command line parser for the ldlm tool: `--name value`, `--name=value`,
// boolean `--flag`, positionals, and `--help`. Anything it rejects is a UsageError
// (exit status 2).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace ldlm::cli {

/// A malformed command line: reported as "ldlm: error: ..." with exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Option {
  std::string name;        // without the leading "--"
  std::string value_name;  // empty for a boolean flag
  std::string help;
};

struct Command {
  std::string name;
  std::string brief;        // its line in 'ldlm --help'
  std::string positionals;  // as shown in the usage line, e.g. "MODULE"
  std::string summary;
  std::vector<Option> options;
  std::string details;  // printed after the option list

  std::string usage() const {
    std::string s = "usage: ldlm " + name;
    if (!positionals.empty()) s += " " + positionals;
    if (!options.empty()) s += " [options]";
    s += "\n\n" + summary + "\n";
    if (!options.empty()) {
      s += "\noptions:\n";
      std::size_t width = 0;
      for (const auto& o : options) width = std::max(width, label(o).size());
      for (const auto& o : options)
        s += "  " + label(o) + std::string(width - label(o).size() + 2, ' ') + o.help + "\n";
      s += "  --help" + std::string(width > 6 ? width - 6 + 2 : 2, ' ') + "show this help\n";
    }
    if (!details.empty()) s += "\n" + details;
    return s;
  }

 private:
  static std::string label(const Option& o) {
    return "--" + o.name + (o.value_name.empty() ? std::string() : " " + o.value_name);
  }
};

class Args {
 public:
  /// Parses argv (the words after the subcommand) against `command`.
  Args(const Command& command, const std::vector<std::string>& argv) : command_(command) {
    for (std::size_t i = 0; i < argv.size(); ++i) {
      const std::string& word = argv[i];
      if (word == "--help" || word == "-h") {
        help_ = true;
        continue;
      }
      if (word == "--") {
        positionals_.insert(positionals_.end(), argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
        break;
      }
      if (word.size() < 2 || word[0] != '-' || is_number(word)) {
        positionals_.push_back(word);
        continue;
      }
      if (word.rfind("--", 0) != 0) fail("unknown option '" + word + "'");
      const std::size_t eq = word.find('=');
      const std::string name = word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      const Option* option = find(name);
      if (!option) fail("unknown option '--" + name + "'");
      if (values_.count(name)) fail("option '--" + name + "' given twice");
      if (option->value_name.empty()) {
        if (eq != std::string::npos) fail("option '--" + name + "' takes no value");
        values_[name] = "";
      } else if (eq != std::string::npos) {
        values_[name] = word.substr(eq + 1);
      } else {
        if (i + 1 >= argv.size()) fail("option '--" + name + "' needs a value " + option->value_name);
        values_[name] = argv[++i];
      }
    }
  }

  bool help() const { return help_; }
  const std::vector<std::string>& positionals() const { return positionals_; }

  bool has(const std::string& name) const { return values_.count(require_known(name)) != 0; }

  std::optional<std::string> value(const std::string& name) const {
    auto it = values_.find(require_known(name));
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }

  std::string required(const std::string& name) const {
    if (auto v = value(name)) return *v;
    fail("missing required option '--" + name + "'");
  }

  std::string get(const std::string& name, const std::string& fallback) const { return value(name).value_or(fallback); }

  std::int64_t get_int(const std::string& name, std::int64_t fallback, std::int64_t min,
                       std::int64_t max = std::numeric_limits<std::int64_t>::max()) const {
    const auto v = value(name);
    if (!v) return fallback;
    const auto out = parse_whole<std::int64_t>(name, *v, "an integer");
    if (out < min || out > max)
      fail("option '--" + name + "' must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + *v);
    return out;
  }

  std::uint64_t get_uint(const std::string& name, std::uint64_t fallback) const {
    const auto v = value(name);
    if (!v) return fallback;
    return parse_whole<std::uint64_t>(name, *v, "a non-negative integer");
  }

  double get_double(const std::string& name, double fallback, double min) const {
    const auto v = value(name);
    if (!v) return fallback;
    std::size_t used = 0;
    double out = 0;
    try {
      out = std::stod(*v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v->size() || !(out >= min) || out == std::numeric_limits<double>::infinity())
      fail("option '--" + name + "' expects a finite number >= " + format_number(min) + ", got '" + *v + "'");
    return out;
  }

  /// Throws unless the positional count is in [min, max].
  void expect_positionals(std::size_t min, std::size_t max) const {
    if (positionals_.size() < min)
      fail("missing argument" + std::string(min - positionals_.size() > 1 ? "s" : "") + " (usage: ldlm " +
           command_.name + " " + command_.positionals + " ...)");
    if (positionals_.size() > max) fail("unexpected argument '" + positionals_[max] + "'");
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw UsageError(command_.name + ": " + message + "\n(see 'ldlm " + command_.name + " --help')");
  }

 private:
  /// The whole of v as an integer of type T, else a usage error naming the option.
  template <class T>
  T parse_whole(const std::string& name, const std::string& v, const char* expected) const {
    T out = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (ec != std::errc() || end != v.data() + v.size() || v.empty())
      fail("option '--" + name + "' expects " + expected + ", got '" + v + "'");
    return out;
  }

  static bool is_number(const std::string& w) {
    double d;
    const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), d);
    return ec == std::errc() && end == w.data() + w.size();
  }
  static std::string format_number(double v) {
    std::string s = std::to_string(v);
    while (s.size() > 1 && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }

  const Option* find(const std::string& name) const {
    for (const auto& o : command_.options)
      if (o.name == name) return &o;
    return nullptr;
  }
  const std::string& require_known(const std::string& name) const {
    if (!find(name)) throw std::logic_error("ldlm cli: option '" + name + "' is not declared by " + command_.name);
    return name;
  }

  const Command& command_;
  bool help_ = false;
  std::vector<std::string> positionals_;
  std::map<std::string, std::string> values_;
};

}  // namespace ldlm::cli
