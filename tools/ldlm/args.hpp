// The command line of the ldlm tool. Each option is declared once: its name, value name,
// the field it fills (a member of an options struct), bounds and help. The struct's
// default member value is the option's default, so the help line (which prints the
// default and the allowed values) and the parsing come from the same declaration:
//
//   value_option("steps", "N", &SamplerOptions::steps, {1, kMaxSteps}, "solver steps")
//   choice_option("schedule", "GRID", &TimeGridOptions::grid, kTimeGrids, "time grid", "...")
//
// and a subcommand reads the struct back with `args.read<SamplerOptions>()`. The syntax is
// `--name value`, `--name=value`, boolean `--flag`, positionals and `--help`; anything
// rejected is a UsageError (exit status 2).
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "ldlm/sampling/schedule.hpp"

namespace ldlm::cli {

/// A malformed command line: reported as "ldlm: error: ..." with exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Option {
  std::string name;        // without the leading "--"
  std::string value_name;  // empty for a boolean flag
  std::string help;        // ends with the default and the allowed values
  bool required = false;
  const void* owner = nullptr;  // the options struct of the field it fills (owner_tag<C>)
  /// Parses `value` into the field of `object` (of the owner's type); returns the error
  /// message, empty when the value is accepted.
  std::function<std::string(void* object, const std::string& value)> store;
};

/// An address per options struct: the owner of an option.
template <class C>
const void* owner_tag() {
  static const char tag = 0;
  return &tag;
}

/// The allowed values of a number option: [min, max], or (min, max] with open_min. The
/// type's lowest and largest values mean "no bound".
template <class T>
struct Bounds {
  T min = std::numeric_limits<T>::lowest();
  T max = std::numeric_limits<T>::max();
  bool open_min = false;

  bool contains(T v) const { return (open_min ? v > min : v >= min) && v <= max; }
  std::string text() const;
};

namespace detail {

template <class T>
struct Unwrap {
  using type = T;
  static constexpr bool optional = false;
};
template <class T>
struct Unwrap<std::optional<T>> {
  using type = T;
  static constexpr bool optional = true;
};

template <class T>
std::string number_text(T v) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else {
    std::ostringstream out;
    out << v;
    return out.str();
  }
}

/// The whole of `text` as a T (a finite one for floating T).
template <class T>
std::optional<T> parse_number(const std::string& text) {
  T out{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(out)) return std::nullopt;
  return out;
}

template <class T>
const char* number_kind() {
  if constexpr (std::is_floating_point_v<T>) return "a finite number";
  if constexpr (std::is_unsigned_v<T>) return "a non-negative integer";
  return "an integer";
}

/// The value of a choice table's entry: NamedChoice's `value`, SamplerInfo's `kind`.
template <class Entry>
auto entry_value(const Entry& entry) {
  if constexpr (requires { entry.value; })
    return entry.value;
  else
    return entry.kind;
}

/// `help` followed by its facts in parentheses: "(default 10, in [1, 1048576])". A help
/// of several lines gets them at the end of its last line.
inline std::string with_facts(std::string help, const std::vector<std::string>& facts) {
  std::string joined;
  for (const auto& fact : facts)
    if (!fact.empty()) joined += (joined.empty() ? "" : ", ") + fact;
  return joined.empty() ? help : help + " (" + joined + ")";
}

/// An option filling a field of C: `store` parses into a C.
template <class C, class Store>
Option make_option(std::string name, std::string value_name, std::string help, Store store) {
  return {std::move(name),
          std::move(value_name),
          std::move(help),
          false,
          owner_tag<C>(),
          [store](void* object, const std::string& value) { return store(*static_cast<C*>(object), value); }};
}

}  // namespace detail

template <class T>
std::string Bounds<T>::text() const {
  const bool has_min = min != std::numeric_limits<T>::lowest(), has_max = max != std::numeric_limits<T>::max();
  if (has_min && has_max)
    return std::string("in ") + (open_min ? "(" : "[") + detail::number_text(min) + ", " + detail::number_text(max) +
           "]";
  if (has_min) return (open_min ? "> " : ">= ") + detail::number_text(min);
  if (has_max) return "<= " + detail::number_text(max);
  return "";
}

/// `--name V`: an integer or floating field (or an optional one, which has no default:
/// the help says what its absence means), within `bounds`.
template <class C, class F>
Option value_option(std::string name, std::string value_name, F C::*field,
                    Bounds<typename detail::Unwrap<F>::type> bounds, const std::string& help) {
  using T = typename detail::Unwrap<F>::type;
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "value_option: a number field");
  std::string fallback;
  if constexpr (!detail::Unwrap<F>::optional) fallback = "default " + detail::number_text(C{}.*field);
  return detail::make_option<C>(name, std::move(value_name), detail::with_facts(help, {fallback, bounds.text()}),
                                [name, field, bounds](C& object, const std::string& text) -> std::string {
                                  const std::optional<T> v = detail::parse_number<T>(text);
                                  if (!v)
                                    return "option '--" + name + "' expects " + detail::number_kind<T>() + ", got '" +
                                           text + "'";
                                  if (!bounds.contains(*v))
                                    return "option '--" + name + "' must be " + bounds.text() + ", got " + text;
                                  object.*field = *v;
                                  return "";
                                });
}

/// `--name TEXT`: a string field, or an optional one (absent unless given).
template <class C, class F>
Option text_option(std::string name, std::string value_name, F C::*field, const std::string& help) {
  static_assert(std::is_same_v<typename detail::Unwrap<F>::type, std::string>, "text_option: a string field");
  std::string fallback;
  if constexpr (!detail::Unwrap<F>::optional)
    if (!(C{}.*field).empty()) fallback = "default " + C{}.*field;
  return detail::make_option<C>(std::move(name), std::move(value_name), detail::with_facts(help, {fallback}),
                                [field](C& object, const std::string& text) {
                                  object.*field = text;
                                  return std::string();
                                });
}

/// `--name`: a flag that sets a bool field.
template <class C>
Option flag_option(std::string name, bool C::*field, const std::string& help) {
  return detail::make_option<C>(std::move(name), "", help, [field](C& object, const std::string&) {
    object.*field = true;
    return std::string();
  });
}

/// `--name NAME`: one of the names of a table of named choices (NamedChoice, SamplerInfo),
/// whose value fills the field. `what` names the kind of choice in the error, e.g.
/// "unknown time grid 'cosine' for '--schedule' (expected one of: uniform, lambda, karras)".
template <class C, class E, class Table>
Option choice_option(std::string name, std::string value_name, E C::*field, const Table& table, std::string what,
                     const std::string& help) {
  std::string fallback;
  for (const auto& entry : table)
    if (detail::entry_value(entry) == C{}.*field) fallback = "default " + std::string(entry.name);
  return detail::make_option<C>(name, std::move(value_name), detail::with_facts(help, {fallback}),
                                [name, what, field, &table](C& object, const std::string& text) -> std::string {
                                  if (const auto* entry = ldlm::detail::find_named(table, text)) {
                                    object.*field = detail::entry_value(*entry);
                                    return "";
                                  }
                                  return "unknown " + what + " '" + text + "' for '--" + name +
                                         "' (expected one of: " + ldlm::detail::joined_names(table, ", ") + ")";
                                });
}

/// `option`, which every run of its command must give.
inline Option required(Option option) {
  option.required = true;
  option.help += " (required)";
  return option;
}

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
      std::size_t width = std::string("--help").size();
      for (const auto& o : options) width = std::max(width, label(o).size());
      const std::string indent(width + 4, ' ');
      const auto line = [&](const std::string& label, const std::string& help) {
        s += "  " + label + std::string(width - label.size() + 2, ' ');
        for (const char c : help) s += c == '\n' ? "\n" + indent : std::string(1, c);
        s += "\n";
      };
      for (const auto& o : options) line(label(o), o.help);
      line("--help", "show this help");
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
      if (word.size() < 2 || word[0] != '-' || detail::parse_number<double>(word)) {
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

  /// `object` with the field of every given option of C's set; a bad value or a missing
  /// required option is a usage error.
  template <class C>
  C read(C object = {}) const {
    for (const Option& option : command_.options) {
      if (option.owner != owner_tag<C>()) continue;
      const auto it = values_.find(option.name);
      if (it == values_.end()) {
        if (option.required) fail("missing required option '--" + option.name + "'");
        continue;
      }
      if (const std::string error = option.store(&object, it->second); !error.empty()) fail(error);
    }
    return object;
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
  const Option* find(const std::string& name) const {
    for (const auto& o : command_.options)
      if (o.name == name) return &o;
    return nullptr;
  }

  const Command& command_;
  bool help_ = false;
  std::vector<std::string> positionals_;
  std::map<std::string, std::string> values_;
};

}  // namespace ldlm::cli
