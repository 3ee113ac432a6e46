// The one JSON reader for everything ldlm reads from outside: the model
// configuration, the safetensors header and the tokenizer files. nlohmann's parser
// checks the syntax (RFC 8259: well-formed UTF-8, valid escapes and surrogate pairs,
// no comments, nothing after the value); this header refuses what that parser lets
// through: nesting deeper than kMaxJsonDepth, with which a hostile file would make a
// recursive consumer (or the destructor of the parsed value) exhaust the stack, and a
// key repeated in one object, which nlohmann resolves silently by keeping the last.
//
// Errors go to the caller's `fail(const JsonProblem&)`, which must throw: the caller
// knows the file's name and the exception type (ConfigError, FormatError), the reader
// knows what went wrong and where in the document.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ldlm/core/error.hpp"
#include "ldlm/io/utf8.hpp"

namespace ldlm {

/// The deepest nesting of objects and arrays accepted. ldlm's own inputs need at most
/// 8 (a tokenizer.json post-processor; the safetensors header needs 3, the
/// configuration 1); the limit only has to bound what a hostile file can make the
/// parser and the consumers walk.
inline constexpr int kMaxJsonDepth = 16;

/// Why a JSON text was refused. `message` describes it completely but for the file's
/// name, which the caller puts in front.
struct JsonProblem {
  enum class Kind {
    syntax,         // not JSON at all: nlohmann's message, with line and column
    too_deep,       // an object or array nested deeper than kMaxJsonDepth
    duplicate_key,  // `key` appears twice in the object at `path`
    not_an_object,  // read_json_members: the document is `found`, not an object
    nested_value,   // read_json_members: the value of `key` is `found`, not a scalar
  };
  Kind kind;
  std::string key;    // duplicate_key, nested_value: the key, as read
  std::string path;   // where: "" for the document, "model.vocab", "added_tokens[2]"
  std::string found;  // not_an_object, nested_value: what stood there ("an array", "number 42")
  std::string message;
};

namespace detail {

/// "string \"abc\"", "number 7", "null": a JSON value's type and (cut) text for messages.
inline std::string json_summary(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 40) {
    std::size_t n = 40;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // whole characters only
    s = s.substr(0, n) + "...";
  }
  return std::string(v.type_name()) + " " + s;
}

/// Hands `problem` to the caller's `fail`, which must throw.
template <class Fail>
[[noreturn]] void json_fail(Fail& fail, JsonProblem problem) {
  fail(problem);
  throw Error("JSON reader: the caller's error handler returned on: " + problem.message);
}

inline JsonProblem json_syntax_problem(const std::exception& e) {
  return {JsonProblem::Kind::syntax, {}, {}, {}, std::string("not valid JSON: ") + e.what()};
}

inline JsonProblem json_depth_problem(const std::string& path) {
  return {JsonProblem::Kind::too_deep,
          {},
          path,
          {},
          "JSON is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels" +
              (path.empty() ? std::string() : " at " + quote(path))};
}

/// The open objects and arrays of a document being parsed, for the depth limit, the
/// repeated keys and the path of a problem.
class JsonNesting {
 public:
  /// An object or array opens; the caller has checked the depth.
  void open(bool array) { frames_.push_back({array, 0, nullptr, {}}); }

  /// A key of the innermost object; false if that object has it already.
  bool key(const std::string& k) {
    Frame& f = frames_.back();
    const auto [it, fresh] = f.keys.insert(k);
    f.key = &*it;
    return fresh;
  }

  /// A value ends: a scalar, or (after close) an object or array.
  void value_done() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().count;
  }
  void close() {
    frames_.pop_back();
    value_done();
  }

  /// "model.vocab", "added_tokens[2]": where the next value goes ("" at the top).
  std::string path() const { return path_through(frames_.size()); }

  /// The path of the innermost open object or array itself.
  std::string innermost_path() const { return path_through(frames_.size() - 1); }

 private:
  /// The path through the outermost `n` frames.
  std::string path_through(std::size_t n) const {
    std::string out;
    for (std::size_t i = 0; i < n; ++i) {
      const Frame& f = frames_[i];
      if (f.array) {
        out += '[';  // appended piece by piece: GCC 12 misreads "[" + std::string (-Wrestrict)
        out += std::to_string(f.count);
        out += ']';
      } else if (f.key) {
        if (!out.empty()) out += '.';
        out += *f.key;
      }
    }
    return out;
  }

  struct Frame {
    bool array;
    std::size_t count;           // arrays: elements read so far
    const std::string* key;      // objects: the member being read (in `keys`)
    std::set<std::string> keys;  // objects: every key read so far
  };
  std::vector<Frame> frames_;
};

}  // namespace detail

/// Parses a whole JSON document: RFC 8259, nesting at most kMaxJsonDepth deep, no key
/// twice in one object. Objects come back sorted by key (nlohmann::json's std::map).
template <class Fail>
nlohmann::json read_json(std::string_view text, Fail&& fail) {
  using nlohmann::json;
  detail::JsonNesting nesting;
  auto check = [&](int depth, json::parse_event_t event, json& value) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) detail::json_fail(fail, detail::json_depth_problem(nesting.path()));
        nesting.open(event == json::parse_event_t::array_start);
        break;
      case json::parse_event_t::key:
        if (!nesting.key(value.get_ref<const std::string&>())) {
          const std::string& k = value.get_ref<const std::string&>();
          const std::string path = nesting.innermost_path();
          detail::json_fail(
              fail, JsonProblem{JsonProblem::Kind::duplicate_key,
                                k,
                                path,
                                {},
                                "duplicate key " + detail::quote(k) + " in " +
                                    (path.empty() ? std::string("the top-level object") : detail::quote(path))});
        }
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        nesting.close();
        break;
      case json::parse_event_t::value:
        nesting.value_done();
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {
    detail::json_fail(fail, detail::json_syntax_problem(e));
  }
}

/// Streams a document that must be one object whose values are scalars (no object or
/// array inside), calling member(key, value) in file order without building the
/// object: for vocabularies of many thousand entries, where building the object was
/// the slow part (bench/results/README.md, "Vocabulary through a SAX parser").
/// Nothing nests, so the depth limit never comes into play. Repeated keys reach
/// `member` as they come; the caller's table refuses them.
template <class Fail, class Member>
void read_json_members(std::string_view text, Fail&& fail, Member&& member) {
  using json = nlohmann::json;
  struct Reader : nlohmann::json_sax<json> {
    Fail& fail;
    Member& member;
    std::string member_key;
    bool inside = false;
    Reader(Fail& f, Member& m) : fail(f), member(m) {}

    [[noreturn]] void not_flat(const std::string& found) {
      if (!inside)
        detail::json_fail(
            fail,
            JsonProblem{JsonProblem::Kind::not_an_object, {}, {}, found, "expected a JSON object, found " + found});
      detail::json_fail(fail, JsonProblem{JsonProblem::Kind::nested_value, member_key, member_key, found,
                                          "key " + detail::quote(member_key) +
                                              ": expected a number, a string, a boolean or null, found " + found});
    }
    bool value(json v) {
      if (!inside) not_flat(detail::json_summary(v));
      member(std::move(member_key), std::move(v));
      return true;
    }
    bool null() override { return value(nullptr); }
    bool boolean(bool v) override { return value(v); }
    bool number_integer(number_integer_t v) override { return value(v); }
    bool number_unsigned(number_unsigned_t v) override { return value(v); }
    bool number_float(number_float_t v, const string_t&) override { return value(v); }
    bool string(string_t& v) override { return value(std::move(v)); }
    bool binary(binary_t&) override {
      not_flat("binary data");
      return false;  // not reached (GCC does not see through the noreturn here)
    }
    bool start_object(std::size_t) override {
      if (inside) not_flat("an object");
      inside = true;
      return true;
    }
    bool key(string_t& k) override {
      member_key = std::move(k);
      return true;
    }
    bool end_object() override {
      inside = false;
      return true;
    }
    bool start_array(std::size_t) override {
      not_flat("an array");
      return false;  // not reached
    }
    bool end_array() override { return true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
      detail::json_fail(fail, detail::json_syntax_problem(e));
      return false;  // not reached
    }
  } reader(fail, member);
  json::sax_parse(text.begin(), text.end(), &reader);
}

}  // namespace ldlm
