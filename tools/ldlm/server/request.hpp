// ldlm serve: a request body (JSON, untrusted) to a request struct, or an ApiError naming
// the field, what was expected and what was found. It needs no model: the names a
// field may take and the limits come in `RequestLimits`, so that the libFuzzer target
// tests/fuzz/fuzz_request.cpp includes this header alone. docs/server.md lists the
// fields of every endpoint.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ldlm/io/json.hpp"

namespace ldlm::server {

/// An answer other than 200, as the JSON body {"error": {"message", "type", "field"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string field = {})
      : std::runtime_error(message), status_(status), type_(std::move(type)), field_(std::move(field)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& field() const { return field_; }  // "" when no field is at fault

  std::string body() const {
    nlohmann::json error = {{"message", what()}, {"type", type_}, {"field", nullptr}};
    if (!field_.empty()) error["field"] = field_;
    return nlohmann::json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

 private:
  int status_;
  std::string type_, field_;
};

/// A 400: the request's JSON or one of its fields is wrong.
inline ApiError bad_request(std::string_view endpoint, const std::string& message, std::string field = {}) {
  return ApiError(400, "invalid_request_error", std::string(endpoint) + ": " + message, std::move(field));
}

/// What a request may ask for: the server's limits and the library's names.
struct RequestLimits {
  int max_batch = 16;  // samples per request (n), and sequences per batch
  int max_length = 0;  // positions of a sequence, prompt and suffix included
  int max_steps = 1000;
  int max_resample = 100;
  std::vector<std::string> samplers, schedules, methods, precisions;
};

/// The sampler fields shared by every sampling endpoint, by their CLI names. An empty
/// name means the library's default.
struct SamplingFields {
  int n = 1;
  std::uint64_t seed = 0;
  std::string sampler, schedule, method, precision;
  int steps = 0;  // 0: the default
  int resample = 0;
  bool stream = false;
};

/// POST /infill: a text with "<|mask|>" markers, or ids with the mask id.
struct InfillRequest {
  std::optional<std::string> text;
  std::optional<std::vector<std::int64_t>> ids;
  SamplingFields sampling;
};

/// POST /generate and POST /v1/completions: `length` positions between the prompt and
/// the suffix.
struct GenerateRequest {
  std::string prompt, suffix;
  int length = 16;
  SamplingFields sampling;
};

struct TokenizeRequest {
  std::string text;
};

struct DetokenizeRequest {
  std::vector<std::int64_t> ids;
};

namespace detail {

inline const char* json_kind(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

/// The members of one request body, each read once: what is left unread is an unknown
/// field.
class Body {
 public:
  Body(std::string_view endpoint, std::string_view text) : endpoint_(endpoint) {
    const auto fail = [&](const JsonProblem& problem) -> void {
      throw bad_request(endpoint, "the body is not valid JSON: " + problem.message);
    };
    json_ = read_json(text, fail);
    if (!json_.is_object())
      throw bad_request(endpoint, std::string("the body must be a JSON object, got ") + json_kind(json_));
  }

  const std::string& endpoint() const { return endpoint_; }

  const nlohmann::json* take(const std::string& key) {
    read_.insert(key);
    const auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  [[noreturn]] void wrong(const std::string& key, const std::string& expected, const nlohmann::json& found) const {
    throw bad_request(endpoint_,
                      "field '" + key + "' must be " + expected + ", got " + ldlm::detail::json_summary(found), key);
  }

  std::optional<std::int64_t> integer(const std::string& key, std::int64_t min, std::int64_t max,
                                      const std::string& limit = {}) {
    const nlohmann::json* v = take(key);
    if (!v) return std::nullopt;
    const std::string range = "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]" +
                              (limit.empty() ? "" : " (" + limit + ")");
    if (v->is_number_unsigned()) {
      const std::uint64_t u = v->get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(max)) wrong(key, range, *v);
      return static_cast<std::int64_t>(u);
    }
    if (!v->is_number_integer()) wrong(key, range, *v);
    const std::int64_t i = v->get<std::int64_t>();
    if (i < min || i > max) wrong(key, range, *v);
    return i;
  }

  std::optional<std::uint64_t> seed(const std::string& key) {
    const nlohmann::json* v = take(key);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) return v->get<std::uint64_t>();
    if (v->is_number_integer() && v->get<std::int64_t>() >= 0)
      return static_cast<std::uint64_t>(v->get<std::int64_t>());
    wrong(key, "an integer in [0, 2^64 - 1]", *v);
  }

  std::optional<std::string> string(const std::string& key) {
    const nlohmann::json* v = take(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong(key, "a string", *v);
    return v->get<std::string>();
  }

  std::optional<bool> boolean(const std::string& key) {
    const nlohmann::json* v = take(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong(key, "true or false", *v);
    return v->get<bool>();
  }

  std::string choice(const std::string& key, const std::vector<std::string>& names) {
    const std::optional<std::string> v = string(key);
    if (!v) return {};
    if (std::find(names.begin(), names.end(), *v) == names.end()) {
      std::string list;
      for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
      wrong(key, "one of: " + list, nlohmann::json(*v));
    }
    return *v;
  }

  std::optional<std::vector<std::int64_t>> ids(const std::string& key, std::int64_t max_items) {
    const nlohmann::json* v = take(key);
    if (!v) return std::nullopt;
    if (!v->is_array()) wrong(key, "an array of token ids", *v);
    if (static_cast<std::int64_t>(v->size()) > max_items)
      throw bad_request(endpoint_,
                        "field '" + key + "' has " + std::to_string(v->size()) + " ids, more than the " +
                            std::to_string(max_items) + " positions of --max-length",
                        key);
    std::vector<std::int64_t> out;
    out.reserve(v->size());
    for (std::size_t i = 0; i < v->size(); ++i) {
      const nlohmann::json& id = (*v)[i];
      if (!(id.is_number_integer() || id.is_number_unsigned()) ||
          (id.is_number_unsigned() && id.get<std::uint64_t>() > std::uint64_t{1} << 62) ||
          (!id.is_number_unsigned() && id.get<std::int64_t>() < 0))
        wrong(key + "[" + std::to_string(i) + "]", "a non-negative integer token id", id);
      out.push_back(id.get<std::int64_t>());
    }
    return out;
  }

  /// Refuses every member that no read asked for.
  void finish() const {
    for (const auto& [key, value] : json_.items())
      if (!read_.count(key)) {
        std::string known;
        for (const std::string& k : read_) known += (known.empty() ? "" : ", ") + k;
        throw bad_request(endpoint_, "unknown field '" + key + "' (fields: " + known + ")", key);
      }
  }

 private:
  std::string endpoint_;
  nlohmann::json json_;
  std::set<std::string> read_;
};

inline SamplingFields read_sampling(Body& body, const RequestLimits& limits) {
  SamplingFields s;
  s.n = static_cast<int>(
      body.integer("n", 1, limits.max_batch, "--max-batch " + std::to_string(limits.max_batch)).value_or(1));
  s.seed = body.seed("seed").value_or(0);
  s.sampler = body.choice("sampler", limits.samplers);
  s.schedule = body.choice("schedule", limits.schedules);
  s.method = body.choice("method", limits.methods);
  s.precision = body.choice("precision", limits.precisions);
  s.steps = static_cast<int>(body.integer("steps", 1, limits.max_steps).value_or(0));
  s.resample = static_cast<int>(body.integer("resample", 0, limits.max_resample).value_or(0));
  s.stream = body.boolean("stream").value_or(false);
  return s;
}

inline int max_positions(const RequestLimits& limits) {
  return limits.max_length > 0 ? limits.max_length : std::numeric_limits<int>::max();
}

}  // namespace detail

/// POST /infill.
inline InfillRequest parse_infill(std::string_view text, const RequestLimits& limits) {
  detail::Body body("/infill", text);
  InfillRequest r;
  r.text = body.string("text");
  r.ids = body.ids("ids", detail::max_positions(limits));
  r.sampling = detail::read_sampling(body, limits);
  body.finish();
  if (r.text.has_value() == r.ids.has_value())
    throw bad_request(body.endpoint(),
                      r.text ? "give 'text' or 'ids', not both"
                             : "field 'text' (with <|mask|> markers) or 'ids' (with the mask id) is required",
                      "text");
  return r;
}

/// POST /generate (native) and POST /v1/completions (OpenAI's names: max_tokens for
/// length, and a "model" field, which names the one model served and is not checked).
inline GenerateRequest parse_generate(std::string_view endpoint, std::string_view text, const RequestLimits& limits,
                                      bool openai) {
  detail::Body body(endpoint, text);
  GenerateRequest r;
  r.prompt = body.string("prompt").value_or("");
  r.suffix = body.string("suffix").value_or("");
  const std::string length_field = openai ? "max_tokens" : "length";
  const int positions = std::min(detail::max_positions(limits), 1 << 20);
  r.length = static_cast<int>(
      body.integer(length_field, 1, positions,
                   limits.max_length > 0 ? "--max-length " + std::to_string(limits.max_length) : std::string())
          .value_or(16));
  if (openai) body.string("model");
  r.sampling = detail::read_sampling(body, limits);
  body.finish();
  return r;
}

/// POST /tokenize.
inline TokenizeRequest parse_tokenize(std::string_view text) {
  detail::Body body("/tokenize", text);
  TokenizeRequest r;
  const std::optional<std::string> t = body.string("text");
  body.finish();
  if (!t) throw bad_request(body.endpoint(), "field 'text' (a string) is required", "text");
  r.text = *t;
  return r;
}

/// POST /detokenize.
inline DetokenizeRequest parse_detokenize(std::string_view text, const RequestLimits& limits) {
  detail::Body body("/detokenize", text);
  DetokenizeRequest r;
  std::optional<std::vector<std::int64_t>> ids = body.ids("ids", std::max(detail::max_positions(limits), 1 << 16));
  body.finish();
  if (!ids) throw bad_request(body.endpoint(), "field 'ids' (an array of token ids) is required", "ids");
  r.ids = std::move(*ids);
  return r;
}

}  // namespace ldlm::server
