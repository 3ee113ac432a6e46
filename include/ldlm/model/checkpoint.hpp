// Self-describing LDLM checkpoints: a safetensors file whose `__metadata__` carries
// the model configuration, so loading needs no separate config file. Two metadata
// keys (docs/checkpoints.md):
//   ldlm.config                   Config::to_json(), the configuration of the weights;
//   ldlm.feature_model_init_seed  a decimal seed: the file holds no feature_model.*
//                                 tensors, the frozen GPT-2 is the generator's
//                                 init_parameters(feature_model, seed, "feature_model.").
//   ldlm.quantization             'int8': the weights int8 quantizes are stored as
//                                 I8 with F32 scales (io/state_dict.hpp reads them).
// A configuration given by the caller must equal the file's own; a file without one
// loads with the caller's configuration, or as ldlm-base.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "ldlm/core/init.hpp"
#include "ldlm/io/safetensors.hpp"
#include "ldlm/io/state_dict.hpp"
#include "ldlm/model/config.hpp"
#include "ldlm/model/model.hpp"

namespace ldlm {

/// `__metadata__` key of the configuration (JSON of Config::to_json()).
inline constexpr std::string_view kConfigMetadataKey = "ldlm.config";
/// `__metadata__` key of the feature model's generator seed (decimal).
inline constexpr std::string_view kFeatureModelInitSeedKey = "ldlm.feature_model_init_seed";

namespace detail {
inline const std::string* metadata_value(const SafetensorsFile& file, std::string_view key) {
  const auto it = file.metadata().find(std::string(key));
  return it == file.metadata().end() ? nullptr : &it->second;
}

/// Messages quote at most this much of a hostile metadata value (or of a parser's
/// error, which may echo it).
inline std::string bounded(std::string text, std::size_t limit = 200) {
  if (text.size() > limit) text = text.substr(0, limit) + "...";
  return text;
}
}  // namespace detail

/// The configuration stored in the file, or nullopt when it has none. A value that is
/// not a valid configuration is a ConfigError naming the file and the key.
inline std::optional<Config> read_config(const SafetensorsFile& file) {
  const std::string* text = detail::metadata_value(file, kConfigMetadataKey);
  if (!text) return std::nullopt;
  try {
    return Config::parse(*text, std::string(kConfigMetadataKey));
  } catch (const ConfigError& e) {
    throw ConfigError(detail::file_label(file) + ": __metadata__ '" + std::string(kConfigMetadataKey) +
                      "' is not a valid configuration: " + detail::bounded(e.what()));
  }
}

namespace detail {
/// "key (a_label A, b_label B)" for every key in which the two configurations differ.
inline std::vector<std::string> config_differences(const Config& a, const Config& b, const std::string& a_label,
                                                   const std::string& b_label) {
  const auto ja = a.to_json(), jb = b.to_json();
  std::vector<std::string> out;
  for (auto it = ja.begin(); it != ja.end(); ++it) {
    const auto& other = jb[it.key()];
    if (*it != other)
      out.push_back(it.key() + " (" + a_label + " " + it->dump() + ", " + b_label + " " + other.dump() + ")");
  }
  return out;
}
}  // namespace detail

/// The configuration to build the model from: the file's own, which `given` (if any)
/// must equal; `given` for a file without one; ldlm-base when there is neither.
/// A disagreement is a ConfigError listing every differing key with both values.
inline Config resolve_config(const SafetensorsFile& file, const std::optional<Config>& given) {
  const std::optional<Config> stored = read_config(file);
  if (!stored) return given.value_or(Config{});
  if (!given) return *stored;
  const auto differences = detail::config_differences(*given, *stored, "given", "file");
  if (differences.empty()) return *stored;
  std::string msg = detail::file_label(file) + ": the configuration given differs from the file's own (__metadata__ '" +
                    std::string(kConfigMetadataKey) + "') in " + std::to_string(differences.size()) + " key(s): ";
  for (std::size_t i = 0; i < differences.size(); ++i) msg += (i ? ", " : "") + differences[i];
  throw ConfigError(msg);
}

/// The seed of a generated feature model, or nullopt. Anything but a plain decimal
/// that fits 64 bits is a CheckpointError naming the file and the key.
inline std::optional<std::uint64_t> read_feature_model_init_seed(const SafetensorsFile& file) {
  const std::string* text = detail::metadata_value(file, kFeatureModelInitSeedKey);
  if (!text) return std::nullopt;
  std::uint64_t seed = 0;
  const char* end = text->data() + text->size();
  const auto [stop, ec] = std::from_chars(text->data(), end, seed);  // no sign, no blanks, no "0x"
  if (text->empty() || ec != std::errc() || stop != end)
    throw CheckpointError(detail::file_label(file) + ": __metadata__ '" + std::string(kFeatureModelInitSeedKey) +
                          "' must be a decimal integer in [0, 2^64), got '" + detail::bounded(*text, 64) + "'");
  return seed;
}

namespace detail {
inline const std::string kFeatureModelPrefix = std::string(GPT2Features<float>::kName) + ".";

/// A generated feature model and stored feature_model.* parameters contradict each other.
inline void require_no_feature_model_tensors(const SafetensorsFile& file) {
  std::vector<std::string> stored;
  for (const TensorInfo& t : file.tensors())
    if (t.name.starts_with(kFeatureModelPrefix) && !is_gpt2_buffer(t.name)) stored.push_back("'" + t.name + "'");
  if (stored.empty()) return;
  throw CheckpointError(file_label(file) + ": __metadata__ '" + std::string(kFeatureModelInitSeedKey) +
                        "' says the feature model is generated, yet the file holds " + std::to_string(stored.size()) +
                        " feature_model tensor(s), e.g. " + stored.front());
}

/// A module seen through a filter on its parameter names.
template <class M, class Keep>
struct FilteredModule {
  M& module;
  Keep keep;
  template <class F>
  void visit(const std::string& prefix, F&& f) {
    module.visit(prefix, [&](const std::string& name, auto& p) {
      if (keep(name)) f(name, p);
    });
  }
};
}  // namespace detail

/// Fills the module of `model` called `name` (one of module_names()) from a full-model
/// file; the tensors of other modules are ignored. A generated feature model is
/// regenerated from its seed. The caller builds `model` from resolve_config(file, ...).
/// Matrix-product weights are packed for `pack` as they are read (see LoadOptions::pack).
template <class S>
void load_module(LDLM<S>& model, const SafetensorsFile& file, std::string_view name,
                 std::optional<Precision> pack = Precision::fp32) {
  const std::string prefix = std::string(name) + ".";
  if (name == GPT2Features<S>::kName) {
    if (const auto seed = read_feature_model_init_seed(file)) {
      detail::require_no_feature_model_tensors(file);
      init_parameters(model.feature_model, *seed, prefix, pack);
      return;
    }
  }
  LoadOptions options = LoadOptions::scoped(prefix);
  options.pack = pack;
  with_module(model, name, [&](auto& module) { load_parameters(module, file, prefix, options); });
}

/// Seed of the generator weights the ldlm tool and the examples use when they are given
/// no file (the seed of the model_base reference dumps).
inline constexpr std::uint64_t kDefaultInitSeed = 7;

/// Fills the module called `name` of `model`: from `file` when there is one
/// (load_module), else with the deterministic generator of `seed` under its full
/// names, so that its values equal those of init_parameters on the whole LDLM.
/// Matrix-product weights are packed for `pack` as they are filled.
template <class S>
void load_or_init_module(LDLM<S>& model, const std::optional<SafetensorsFile>& file, std::string_view name,
                         std::uint64_t seed = kDefaultInitSeed, std::optional<Precision> pack = Precision::fp32) {
  if (file)
    load_module(model, *file, name, pack);
  else
    with_module(model, name, [&](auto& module) { init_parameters(module, seed, std::string(name) + ".", pack); });
}

/// How load_model reads a file.
struct ModelLoadOptions {
  /// The configuration the caller expects. It must equal the file's own
  /// (ldlm.config); for a file without one it is used as is (default: ldlm-base).
  std::optional<Config> config;
  /// Precision the matrix-product weights are packed for as they are read
  /// (LoadOptions::pack); std::nullopt keeps every parameter plain.
  std::optional<Precision> pack = Precision::fp32;
};

/// The whole LDLM from a self-describing file, strictly: every parameter present with
/// its shape, no tensor left over (GPT-2's attention buffers aside).
template <class S = float>
LDLM<S> load_model(const SafetensorsFile& file, const ModelLoadOptions& options = {}) {
  LDLM<S> model(resolve_config(file, options.config));
  if (const auto seed = read_feature_model_init_seed(file)) {
    detail::require_no_feature_model_tensors(file);
    init_parameters(model.feature_model, *seed, detail::kFeatureModelPrefix, options.pack);
    auto trained = [](const std::string& name) { return !name.starts_with(detail::kFeatureModelPrefix); };
    detail::FilteredModule<LDLM<S>, decltype(trained)> rest{model, trained};
    LoadOptions load;
    load.pack = options.pack;
    load_parameters(rest, file, "", load);
  } else {
    LoadOptions load;
    load.pack = options.pack;
    load_parameters(model, file, "", load);
  }
  return model;
}

template <class S = float>
LDLM<S> load_model(const std::string& path, const ModelLoadOptions& options = {}) {
  return load_model<S>(SafetensorsFile::open(path), options);
}

namespace detail {
/// x in bf16 when every value is one (bit for bit once widened), else nothing.
inline std::optional<std::vector<bf16>> exact_bf16(const float* x, std::int64_t n) {
  std::vector<bf16> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = float_to_bf16(x[i]);
    const float back = bf16_to_float(out[i]);
    if (std::memcmp(&back, x + i, sizeof(float)) != 0) return std::nullopt;
  }
  return out;
}
}  // namespace detail

/// How save_model writes a file.
struct ModelSaveOptions {
  /// Leave the feature model out and record this generator seed instead; the feature
  /// model must hold exactly init_parameters(feature_model, seed, "feature_model.").
  std::optional<std::uint64_t> feature_model_init_seed;
  /// Store every weight that Precision::int8 quantizes as its s8 values and per-channel
  /// scales (quantize_channels; docs/checkpoints.md §Quantized checkpoints), marked by
  /// `__metadata__` 'ldlm.quantization': loading it at int8 packs exactly what
  /// quantizing the fp32 weights at load does, from a quarter of their bytes. Every
  /// other matrix-product weight is written in BF16, the values int8 packs for its
  /// products (rounded to nearest even), and every other parameter in BF16 where that is
  /// exact (each of its values a bf16 value), else in F32: at int8 nothing changes.
  bool quantize_int8 = false;
};

/// Writes every parameter under its full state-dict name with the configuration in
/// `__metadata__`, so load_model and every `ldlm` command need no config file.
template <class S>
void save_model(const LDLM<S>& model, const std::string& path, const ModelSaveOptions& options = {}) {
  if constexpr (!std::is_same_v<S, float>)
    if (options.quantize_int8)
      throw InvalidArgument("save_model " + path + ": int8 quantization needs a float model, this one is double");
  SafetensorsWriter writer;
  writer.set_metadata(std::string(kConfigMetadataKey), model.config.to_json().dump());
  const auto& seed = options.feature_model_init_seed;
  if (seed) {
    writer.set_metadata(std::string(kFeatureModelInitSeedKey), std::to_string(*seed));
    // Checked, not trusted: a file claiming generated weights that are not would load
    // as a different model without any error.
    visit_parameters(model.feature_model, detail::kFeatureModelPrefix, [&](const std::string& name, const auto& p) {
      Parameter<S> expected(p.shape());
      init_parameter(expected, name, *seed);
      if (std::memcmp(expected.data(), p.data(), sizeof(S) * std::size_t(p.numel())) != 0)
        throw InvalidArgument("save_model " + path + ": parameter '" + name +
                              "' differs from the generator's values for feature_model_init_seed " +
                              std::to_string(*seed));
    });
  }
  if (options.quantize_int8) writer.set_metadata(std::string(kQuantizationMetadataKey), std::string(kQuantizationInt8));
  visit_parameters(model, "", [&](const std::string& name, const auto& p) {
    if (seed && name.starts_with(detail::kFeatureModelPrefix)) return;
    if constexpr (requires { p.quantized_at_int8(); } && std::is_same_v<S, float>) {
      if (options.quantize_int8 && p.quantized_at_int8()) {
        const S8Weight q = quantize_channels(p.matrix(), p.layout());
        writer.add(name, DType::I8, p.shape(),
                   std::as_bytes(std::span<const std::int8_t>(q.values.data(), q.values.size())));
        writer.add(name + std::string(kScaleSuffix), Shape{p.out_features()}, q.scales.data());
        return;
      }
      if (options.quantize_int8) {  // int8 packs it in bf16: these are the values it multiplies
        std::vector<bf16> rounded(static_cast<std::size_t>(p.numel()));
        to_bf16(p.data(), p.numel(), rounded.data());
        return writer.add(name, DType::BF16, p.shape(), std::as_bytes(std::span<const bf16>(rounded)));
      }
    }
    if constexpr (std::is_same_v<S, float>)
      if (options.quantize_int8) {
        if (auto rounded = detail::exact_bf16(p.data(), p.numel()))
          return writer.add(name, DType::BF16, p.shape(), std::as_bytes(std::span<const bf16>(*rounded)));
      }
    writer.add(name, p.shape(), p.data());
  });
  writer.write(path);
}

}  // namespace ldlm
