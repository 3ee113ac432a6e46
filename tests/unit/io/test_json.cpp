// The one strict JSON reader (ldlm/io/json.hpp) that the configuration, the
// safetensors header and the tokenizer files go through: what it accepts, and one
// hostile input per rule, each checking the problem's kind, place and message.
#include "ldlm/io/json.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/errors.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace unit_io_json {
namespace {

using ldlm::JsonProblem;
using ldlm::kMaxJsonDepth;
using ::testing::HasSubstr;

/// What read_json refuses a text for, carried out of `fail` in an exception.
struct Refused : ldlm::Error {
  explicit Refused(JsonProblem p) : ldlm::Error(p.message), problem(std::move(p)) {}
  JsonProblem problem;
};

nlohmann::json read(const std::string& text) {
  return ldlm::read_json(text, [](const JsonProblem& p) { throw Refused(p); });
}

/// The problem `f` is refused for; a test failure when it is accepted.
template <class F>
JsonProblem refusal(F&& f, const std::string& text) {
  try {
    f(text);
  } catch (const Refused& e) {
    return e.problem;
  }
  ADD_FAILURE() << "accepted: " << text;
  return {};
}

JsonProblem problem_of(const std::string& text) { return refusal(read, text); }

std::string nested(int depth, const std::string& inner = "1") {
  return std::string(std::size_t(depth), '[') + inner + std::string(std::size_t(depth), ']');
}

TEST(JsonReader, ReadsDocumentsWithObjectsSortedByKey) {
  const auto j = read(R"({"b": [1, -2, 3.5, "x\u00e9\ud83d\ude00", true, null], "a": {"c": 18446744073709551615}})");
  EXPECT_EQ(j.dump(), R"({"a":{"c":18446744073709551615},"b":[1,-2,3.5,"xé😀",true,null]})");
  EXPECT_TRUE(j["a"]["c"].is_number_unsigned());
  EXPECT_EQ(read(" 42 \n").get<int>(), 42);
  // The same key in different objects is no repeat.
  EXPECT_EQ(read(R"([{"k": 1}, {"k": 2}, {"o": {"k": 3}, "k": 4}])").size(), 3u);
}

TEST(JsonReader, NestsExactlyToTheLimit) {
  EXPECT_EQ(kMaxJsonDepth, 16);
  EXPECT_NO_THROW(read(nested(kMaxJsonDepth)));
  const JsonProblem p = problem_of(nested(kMaxJsonDepth + 1));
  EXPECT_EQ(p.kind, JsonProblem::Kind::too_deep);
  EXPECT_EQ(p.message, "JSON is nested deeper than 16 levels at '[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]'");
  // A million brackets stop at the limit, inside objects as inside arrays.
  EXPECT_EQ(problem_of(std::string(1'000'000, '[')).kind, JsonProblem::Kind::too_deep);
  std::string objects;
  for (int i = 0; i < 1000; ++i) objects += "{\"k\":";
  EXPECT_THAT(problem_of(objects).message, HasSubstr("nested deeper than 16 levels at 'k.k.k.k."));
}

TEST(JsonReader, RefusesARepeatedKeyNamingItsObject) {
  JsonProblem p = problem_of(R"({"a": 1, "b": 2, "a": 3})");
  EXPECT_EQ(p.kind, JsonProblem::Kind::duplicate_key);
  EXPECT_EQ(p.key, "a");
  EXPECT_EQ(p.path, "");
  EXPECT_EQ(p.message, "duplicate key 'a' in the top-level object");
  p = problem_of(R"({"model": {"vocab": {"x": 0, "y": 1, "x": 2}}})");
  EXPECT_EQ(p.path, "model.vocab");
  EXPECT_EQ(p.message, "duplicate key 'x' in 'model.vocab'");
  // Array elements count scalars and containers alike.
  p = problem_of(R"({"added": [1, [2], {"id": 1}, {"id": 2, "id": 3}]})");
  EXPECT_EQ(p.message, "duplicate key 'id' in 'added[3]'");
  // Keys compare as decoded: an escape does not make a new key.
  EXPECT_EQ(problem_of(R"({"a": 1, "\u0061": 2})").key, "a");
  // A hostile key is quoted in part, its control bytes escaped.
  const std::string long_key(10'000, 'k');
  EXPECT_LT(problem_of("{\"" + long_key + "\": 1, \"" + long_key + "\": 2}").message.size(), 200u);
  EXPECT_EQ(problem_of(R"({"\n": 1, "\n": 2})").message, "duplicate key '\\x0a' in the top-level object");
}

TEST(JsonReader, RefusesWhatIsNotJson) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "empty input"},
      {"{} x", "trailing garbage"},
      {"{}{}", "a second document"},
      {"[1,]", "a trailing comma"},
      {"{'a': 1}", "single quotes"},
      {"// c\n{}", "a comment"},
      {R"(["\x"])", "an unknown escape"},
      {R"(["\u12"])", "a short \\u escape"},
      {R"(["\ud800"])", "a lone high surrogate"},
      {R"(["\udc00"])", "a lone low surrogate"},
      {"[\"\xff\"]", "a byte that is not UTF-8"},
      {"[\"\xc0\xaf\"]", "an overlong encoding"},
      {"[\"a\tb\"]", "a raw control character"},
      {"[01]", "a leading zero"},
      {"[1.]", "a fraction without digits"},
      {"[.5]", "a fraction without an integer part"},
      {"[+1]", "a plus sign"},
      {"[1e]", "an exponent without digits"},
      {"[NaN]", "NaN"},
      {"[Infinity]", "Infinity"},
      {"[1e400]", "a number beyond double"},
      {"[tru]", "a cut literal"},
  };
  for (const auto& [text, what] : cases) {
    SCOPED_TRACE(what);
    const JsonProblem p = problem_of(text);
    EXPECT_EQ(p.kind, JsonProblem::Kind::syntax);
    EXPECT_THAT(p.message, HasSubstr("not valid JSON: [json.exception."));
  }
  EXPECT_THAT(problem_of("{\"a\": 1,\n \"b\": x}").message, HasSubstr("parse error at line 2, column 7"));
}

TEST(JsonReader, AHandlerThatReturnsIsAnError) {
  EXPECT_THAT(ldlm::test::error_of<ldlm::Error>([] { ldlm::read_json("{", [](const JsonProblem&) {}); }),
              HasSubstr("the caller's error handler returned on: not valid JSON"));
}

using Members = std::vector<std::pair<std::string, nlohmann::json>>;

Members members(const std::string& text) {
  Members out;
  ldlm::read_json_members(
      text, [](const JsonProblem& p) { throw Refused(p); },
      [&](std::string key, nlohmann::json value) { out.emplace_back(std::move(key), std::move(value)); });
  return out;
}

JsonProblem members_problem(const std::string& text) { return refusal(members, text); }

TEST(JsonMembers, StreamsScalarMembersInFileOrder) {
  const Members m = members(R"({"z": 1, "a": "x", "m": null, "z": 2.5, "": true})");
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], (std::pair<std::string, nlohmann::json>{"z", 1}));
  EXPECT_EQ(m[1].first, "a");
  EXPECT_TRUE(m[2].second.is_null());
  EXPECT_EQ(m[3], (std::pair<std::string, nlohmann::json>{"z", 2.5}));  // repeats reach the caller
  EXPECT_EQ(m[4].first, "");
  EXPECT_TRUE(members("{}").empty());
}

TEST(JsonMembers, RefusesAnythingButAnObjectOfScalars) {
  JsonProblem p = members_problem("[1]");
  EXPECT_EQ(p.kind, JsonProblem::Kind::not_an_object);
  EXPECT_EQ(p.found, "an array");
  EXPECT_EQ(p.message, "expected a JSON object, found an array");
  EXPECT_EQ(members_problem("\"abc\"").found, "string \"abc\"");
  p = members_problem(R"({"a": 1, "": {"b": 2}})");
  EXPECT_EQ(p.kind, JsonProblem::Kind::nested_value);
  EXPECT_EQ(p.key, "");
  EXPECT_EQ(p.found, "an object");
  EXPECT_EQ(p.message, "key '': expected a number, a string, a boolean or null, found an object");
  EXPECT_EQ(members_problem(R"({"a": [1]})").found, "an array");
  // The same syntax errors as read_json, nesting never begins.
  for (const char* text : {"", "{} x", R"({"a": "\ud800"})", "{\"a\": 01}", "{\"a\": 1,}"})
    EXPECT_THAT(members_problem(text).message, HasSubstr("not valid JSON: [json.exception.")) << text;
  EXPECT_EQ(members_problem(std::string(1'000'000, '{')).kind, JsonProblem::Kind::syntax);  // '{' is no key
  EXPECT_EQ(members_problem("{\"a\": " + std::string(1'000'000, '[')).kind, JsonProblem::Kind::nested_value);
}

}  // namespace
}  // namespace unit_io_json
