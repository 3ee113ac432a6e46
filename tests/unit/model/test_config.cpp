// The configuration (model/config.hpp, docs/model.md §Configuration): JSON round trips,
// errors that name the key, invalid configurations rejected before any module is built, and
// size keys with realistic inclusive bounds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "ldlm/ldlm.hpp"
#include "support/files.hpp"
#include "support/reference.hpp"
#include "support/configs.hpp"
#include "support/modules.hpp"

namespace unit_model_config {
namespace {

using ldlm::test::error_of;

using namespace ldlm;
using ldlm::test::data_path;
using ldlm::test::small_config;
using ::testing::AllOf;
using ::testing::HasSubstr;

using ldlm::test::largest_config;

TEST(Config, JsonRoundTrip) {
  Config c;
  c.d_model = 128;
  c.n_heads = 2;
  c.head_dim = 64;
  c.softcap = 30.5;
  c.vocab_size = 777;
  c.gpt2_feature_layers = 4;
  c.rotary_interleaved = true;
  c.latent_attention_qk_norm = false;
  c.t_min = 0.125;
  const Config back = Config::parse(c.to_json().dump());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.d_model, 128);
  EXPECT_EQ(back.softcap, 30.5);
  EXPECT_TRUE(back.rotary_interleaved);
  EXPECT_FALSE(back.latent_attention_qk_norm);

  // Missing keys keep the ldlm-base defaults.
  EXPECT_EQ(Config::parse("{}").to_json(), Config{}.to_json());
}

TEST(Config, LoadsTheModelSmallConfig) {
  const Config c = Config::load(data_path("model_small/config.json"));
  EXPECT_EQ(c.d_model, 64);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_positions, 48);
  EXPECT_EQ(c.vocab_size, 101);
  EXPECT_EQ(c.gpt2_layers, 3);
  EXPECT_EQ(c.gpt2_feature_layers, 2);
  EXPECT_EQ(c.token_decoder_mlp_hidden, 96);
  EXPECT_TRUE(c.latent_attention_qk_norm);
  EXPECT_EQ(Config::load(data_path("model_base/config.json")).to_json(), Config{}.to_json());
}

TEST(Config, ErrorsNameTheKey) {
  auto config_error = [](const std::string& text) { return error_of<ConfigError>([&] { Config::parse(text); }); };
  EXPECT_THAT(config_error(R"({"d_modle": 768})"), AllOf(HasSubstr("unknown key"), HasSubstr("'d_modle'")));
  EXPECT_THAT(config_error(R"({"d_model": "768"})"), AllOf(HasSubstr("'d_model'"), HasSubstr("integer")));
  EXPECT_THAT(config_error(R"({"n_heads": 12.5})"), AllOf(HasSubstr("'n_heads'"), HasSubstr("integer")));
  EXPECT_THAT(config_error(R"({"rotary_interleaved": 1})"),
              AllOf(HasSubstr("'rotary_interleaved'"), HasSubstr("boolean")));
  EXPECT_THAT(config_error(R"({"softcap": "50"})"), AllOf(HasSubstr("'softcap'"), HasSubstr("number")));
  EXPECT_THAT(config_error(R"({"n_heads": 10})"),
              AllOf(HasSubstr("'n_heads'"), HasSubstr("head_dim"), HasSubstr("10 * 64 != 768")));
  EXPECT_THAT(config_error(R"({"gpt2_feature_layers": 13})"),
              AllOf(HasSubstr("'gpt2_feature_layers'"), HasSubstr("gpt2_layers (12)"), HasSubstr("13")));
  // Nested values are refused by their type, naming the key; deep nesting by the JSON reader.
  EXPECT_THAT(config_error(R"({"n_heads": 12, "d_model": [768]})"),
              HasSubstr("config <string>: 'd_model' must be an integer, got a JSON array"));
  EXPECT_THAT(config_error(R"({"softcap": {"value": 50}})"),
              HasSubstr("config <string>: 'softcap' must be a number, got a JSON object"));
  EXPECT_THAT(config_error(R"([[1]])"), HasSubstr("config <string>: expected a JSON object, got array"));
  EXPECT_THAT(config_error(R"({"d_model": )" + std::string(100'000, '[')),
              HasSubstr("config <string>: JSON is nested deeper than 16 levels at 'd_model"));
  EXPECT_THAT(config_error("[1, 2]"), HasSubstr("JSON object"));
  EXPECT_THAT(config_error("{"), HasSubstr("not valid JSON"));
  EXPECT_THAT(error_of<IoError>([] { Config::load("/nonexistent/ldlm-config.json"); }),
              HasSubstr("/nonexistent/ldlm-config.json"));
}

TEST(Config, InvalidConfigIsRejectedBeforeAnyModuleIsBuilt) {
  Config no_heads = small_config();
  no_heads.n_heads = 0;
  EXPECT_THAT(error_of<ConfigError>([&] { LDLM<float> m(no_heads); }),
              HasSubstr("config: 'n_heads' must be >= 1, got 0"));
  Config odd = small_config();
  odd.head_dim = 15;
  odd.n_heads = 1;
  odd.d_model = 15;
  EXPECT_THAT(error_of<ConfigError>([&] { LDLM<float> m(odd); }), HasSubstr("config: 'head_dim' must be even"));
  Config huge = small_config();
  huge.vocab_size = std::int64_t{1} << 40;
  EXPECT_THAT(error_of<ConfigError>([&] { LDLM<float> m(huge); }),
              HasSubstr("config: 'vocab_size' must be <= 4194304, got 1099511627776"));
}

TEST(Config, ConfigSizeKeysHaveRealisticInclusiveBounds) {
  const Config largest = largest_config();
  EXPECT_NO_THROW(largest.validate());
  EXPECT_EQ(largest.widest_row(), std::int64_t{1} << 22);
  // Parameter counts of the largest model are formed without overflow.
  const ParameterCounts counts = count_parameters(largest);
  ::testing::Test::RecordProperty("largest_config.trained", std::to_string(counts.trained));
  EXPECT_GT(counts.trained, std::int64_t{1} << 50);
  EXPECT_LT(counts.trained + counts.frozen, std::int64_t{1} << 53);

  struct Bound {
    const char* key;
    std::int64_t max;
    std::int64_t Config::*field;
  };
  const Bound bounds[] = {{"d_model", 65536, &Config::d_model},
                          {"n_heads", 65536, &Config::n_heads},
                          {"head_dim", 65536, &Config::head_dim},
                          {"mlp_mult", 64, &Config::mlp_mult},
                          {"max_positions", 1048576, &Config::max_positions},
                          {"vocab_size", 4194304, &Config::vocab_size},
                          {"token_decoder_mlp_hidden", 4194304, &Config::token_decoder_mlp_hidden},
                          {"encoder_layers", 1024, &Config::encoder_layers},
                          {"denoiser_blocks", 1024, &Config::denoiser_blocks},
                          {"gpt2_layers", 1024, &Config::gpt2_layers}};
  for (const Bound& b : bounds) {
    SCOPED_TRACE(b.key);
    EXPECT_EQ(Config::max_value(b.key), b.max);
    Config over = largest;
    over.*b.field = b.max + 1;
    EXPECT_THAT(error_of<ConfigError>([&] { over.validate(); }),
                HasSubstr("config: '" + std::string(b.key) + "' must be <= " + std::to_string(b.max) + ", got " +
                          std::to_string(b.max + 1)));
  }
  // The JSON route reaches the same check.
  EXPECT_THAT(error_of<ConfigError>([] { Config::parse(R"({"max_positions": 16777216})"); }),
              HasSubstr("config: 'max_positions' must be <= 1048576, got 16777216"));
}

}  // namespace
}  // namespace unit_model_config
