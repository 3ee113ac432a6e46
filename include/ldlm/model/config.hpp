// The model configuration: the single source of truth for every shape. Defaults
// are ldlm-base. Reconstructions (docs/model.md §Reconstructions, and why each was made) are switches, so a user
// holding the real checkpoint can match it without editing code.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "ldlm/core/error.hpp"
#include "ldlm/io/json.hpp"

namespace ldlm {

struct Config {
  // The keys of docs/model.md §Configuration.
  std::int64_t d_model = 768;
  std::int64_t n_heads = 12;
  std::int64_t head_dim = 64;
  std::int64_t mlp_mult = 4;
  std::int64_t max_positions = 1024;
  std::int64_t vocab_size = 50259;
  double softcap = 50.0;
  double layer_norm_eps = 1e-5;
  double rms_norm_eps = 1e-5;
  double rope_base = 10000.0;
  std::int64_t encoder_layers = 6;
  std::int64_t latent_decoder_layers = 6;
  std::int64_t token_decoder_layers = 3;
  std::int64_t token_decoder_mlp_hidden = 3072;
  std::int64_t denoiser_blocks = 12;
  double time_max_period = 10.0;
  std::int64_t gpt2_layers = 12;
  std::int64_t gpt2_feature_layers = 10;

  // Reconstruction switches.
  bool rotary_interleaved = false;       // true only for checkpoints with (2j, 2j+1) pairing
  bool latent_attention_softcap = true;  // softcap inside the Perceiver latent attention
  bool latent_attention_qk_norm = true;  // per-head RMSNorm of q and k in latent attention
  bool token_decoder_rotary = true;
  bool token_decoder_softcap = true;
  bool time_embedding_flip = false;  // false: [cos, sin]; true: [sin, cos]

  // Sampling (docs/model.md §Sampler; reconstruction).
  double schedule_d = 3.0;
  double t_min = 0.05;
  double beta_t_clip = 0.95;

  std::int64_t mlp_hidden() const { return mlp_mult * d_model; }

  /// Calls f(key, field) for every field, in the order of docs/model.md §Configuration.
  template <class Self, class F>
  static void visit_fields(Self& c, F&& f) {
    f("d_model", c.d_model);
    f("n_heads", c.n_heads);
    f("head_dim", c.head_dim);
    f("mlp_mult", c.mlp_mult);
    f("max_positions", c.max_positions);
    f("vocab_size", c.vocab_size);
    f("softcap", c.softcap);
    f("layer_norm_eps", c.layer_norm_eps);
    f("rms_norm_eps", c.rms_norm_eps);
    f("rope_base", c.rope_base);
    f("encoder_layers", c.encoder_layers);
    f("latent_decoder_layers", c.latent_decoder_layers);
    f("token_decoder_layers", c.token_decoder_layers);
    f("token_decoder_mlp_hidden", c.token_decoder_mlp_hidden);
    f("denoiser_blocks", c.denoiser_blocks);
    f("time_max_period", c.time_max_period);
    f("gpt2_layers", c.gpt2_layers);
    f("gpt2_feature_layers", c.gpt2_feature_layers);
    f("rotary_interleaved", c.rotary_interleaved);
    f("latent_attention_softcap", c.latent_attention_softcap);
    f("latent_attention_qk_norm", c.latent_attention_qk_norm);
    f("token_decoder_rotary", c.token_decoder_rotary);
    f("token_decoder_softcap", c.token_decoder_softcap);
    f("time_embedding_flip", c.time_embedding_flip);
    f("schedule_d", c.schedule_d);
    f("t_min", c.t_min);
    f("beta_t_clip", c.beta_t_clip);
  }

  /// The largest value validate() accepts for an integer key: far beyond any
  /// published model, and small enough that every per-sequence product the modules
  /// form (T times the widest row, at most 2^42) and every parameter count (below
  /// 2^52) fits a 64-bit index with room to spare. Only the batch size B is then
  /// left to overflow, and it is checked where it is known (check_batch_fits).
  static std::int64_t max_value(std::string_view key) {
    if (key == "d_model" || key == "n_heads" || key == "head_dim") return std::int64_t{1} << 16;
    if (key == "mlp_mult") return 64;
    if (key == "max_positions") return std::int64_t{1} << 20;
    if (key == "vocab_size" || key == "token_decoder_mlp_hidden") return std::int64_t{1} << 22;
    return 1024;  // layer and block counts
  }

  /// The widest row any module holds per position (or per sequence): 6d for the
  /// adaLN output, 4d for the latent attention's keys and values over both streams,
  /// the MLP hidden widths and the vocabulary. At most 2^22 in a valid config.
  std::int64_t widest_row() const {
    return std::max({6 * d_model, mlp_hidden(), token_decoder_mlp_hidden, vocab_size});
  }

  /// Throws ConfigError naming the first key whose value is out of range or
  /// inconsistent with the others.
  void validate() const {
    auto fail = [](const std::string& key, const std::string& why) {
      throw ConfigError("config: '" + key + "' " + why);
    };
    visit_fields(*this, [&](const char* key, const auto& v) {
      using V = std::decay_t<decltype(v)>;
      if constexpr (std::is_same_v<V, std::int64_t>) {
        const bool may_be_zero = std::string(key).ends_with("_layers") || std::string(key) == "denoiser_blocks";
        if (v < (may_be_zero ? 0 : 1))
          fail(key, "must be " + std::string(may_be_zero ? ">= 0" : ">= 1") + ", got " + std::to_string(v));
        if (v > max_value(key))
          fail(key, "must be <= " + std::to_string(max_value(key)) + ", got " + std::to_string(v));
      } else if constexpr (std::is_same_v<V, double>) {
        if (!std::isfinite(v) || v < 0) fail(key, "must be a finite number >= 0, got " + nlohmann::json(v).dump());
      }
    });
    if (n_heads * head_dim != d_model)
      fail("n_heads", "* head_dim must equal d_model: " + std::to_string(n_heads) + " * " + std::to_string(head_dim) +
                          " != " + std::to_string(d_model));
    if (head_dim % 2 != 0) fail("head_dim", "must be even for rotary, got " + std::to_string(head_dim));
    if (d_model % 2 != 0) fail("d_model", "must be even for the timestep embedding, got " + std::to_string(d_model));
    if (gpt2_feature_layers > gpt2_layers)
      fail("gpt2_feature_layers",
           "must be <= gpt2_layers (" + std::to_string(gpt2_layers) + "), got " + std::to_string(gpt2_feature_layers));
    if (layer_norm_eps <= 0) fail("layer_norm_eps", "must be > 0");
    if (rms_norm_eps <= 0) fail("rms_norm_eps", "must be > 0");
    if (rope_base <= 1) fail("rope_base", "must be > 1");
    if (time_max_period <= 0) fail("time_max_period", "must be > 0");
    if (schedule_d <= 0) fail("schedule_d", "must be > 0");
    if (!(t_min > 0 && t_min < 1)) fail("t_min", "must be in (0, 1)");
    if (!(beta_t_clip > 0 && beta_t_clip < 1)) fail("beta_t_clip", "must be in (0, 1)");
  }

  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json j;
    visit_fields(*this, [&](const char* key, const auto& v) { j[key] = v; });
    return j;
  }

  /// Missing keys keep their ldlm-base default; an unknown key, a value of the
  /// wrong type or an invalid combination is a ConfigError naming the key.
  static Config from_json(const nlohmann::json& j) { return from_json(j, "config"); }

  /// The configuration is one flat object of numbers and booleans; `origin` names the
  /// text in messages. Repeated keys and deep nesting are refused by read_json.
  static Config parse(const std::string& text, const std::string& origin = "<string>") {
    const std::string where = "config " + origin;
    return from_json(read_json(text, [&](const JsonProblem& p) { throw ConfigError(where + ": " + p.message); }),
                     where);
  }

  static Config load(const std::string& path) {
    if (!std::filesystem::is_regular_file(path)) throw IoError("config: '" + path + "' is not a readable file");
    std::ifstream in(path);
    if (!in) throw IoError("config: cannot open '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse(ss.str(), "'" + path + "'");
  }

 private:
  /// from_json with `where` ("config", "config 'path'") in front of every message.
  static Config from_json(const nlohmann::json& j, const std::string& where) {
    if (!j.is_object()) throw ConfigError(where + ": expected a JSON object, got " + std::string(j.type_name()));
    Config c;
    for (auto it = j.begin(); it != j.end(); ++it) {
      bool known = false;
      visit_fields(c, [&](const char* key, auto& field) {
        if (it.key() != key) return;
        known = true;
        using V = std::decay_t<decltype(field)>;
        const auto& v = it.value();
        auto wrong = [&](const char* want) {
          // Describe the value without dumping it whole: a caller-built value may be
          // nested arbitrarily deep or be megabytes long.
          std::string got = v.is_structured() ? std::string("a JSON ") + v.type_name() : v.dump();
          if (got.size() > 64) got = got.substr(0, 64) + "...";
          throw ConfigError(where + ": '" + key + "' must be " + want + ", got " + got);
        };
        if constexpr (std::is_same_v<V, bool>) {
          if (!v.is_boolean()) wrong("a boolean");
          field = v.get<bool>();
        } else if constexpr (std::is_same_v<V, std::int64_t>) {
          if (!v.is_number_integer()) wrong("an integer");
          if (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t{1} << 62) wrong("a smaller integer");
          field = v.get<std::int64_t>();
        } else {
          if (!v.is_number()) wrong("a number");
          field = v.get<double>();
        }
      });
      if (!known) throw ConfigError(where + ": unknown key " + detail::quote(it.key()));
    }
    c.validate();
    return c;
  }
};

}  // namespace ldlm
