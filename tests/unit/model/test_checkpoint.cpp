// Self-describing checkpoints (ldlm/model/checkpoint.hpp): the configuration in the
// file's __metadata__, its resolution against a given one, files without metadata,
// malformed metadata, the generated feature model, and GPT-2's attention buffers,
// which every loader ignores; quantized checkpoints (ldlm.quantization), which at int8
// give the outputs of quantizing at load bit for bit, and their corrupt forms. Parity checks use the model_small dumps
// with the single-module float32 tolerance of parity/test_modules.cpp, |got - ref| <= 1e-5 + 1e-5·|ref|.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <optional>
#include <string>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/files.hpp"
#include "support/reference.hpp"
#include "support/modules.hpp"

namespace unit_model_checkpoint {
namespace {

using namespace ldlm;
using ldlm::test::bytes_of;
using ldlm::test::data_path;
using ldlm::test::error_of;
using ldlm::test::expect_matches;
using ldlm::test::find_tensor;
using ldlm::test::kFp32Dump;
using ldlm::test::open_reference;
using ldlm::test::raw_tensors;
using ldlm::test::RawTensor;
using ldlm::test::read_tensor;
using ldlm::test::small_config;
using ldlm::test::TempDir;
using ldlm::test::write_tensors;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kConfigKey(kConfigMetadataKey);
const std::string kSeedKey(kFeatureModelInitSeedKey);

std::vector<RawTensor> small_weights() { return raw_tensors(open_reference("model_small/weights.safetensors")); }

/// model_small's weights (no metadata of ours) with `metadata` added.
std::string small_weights_with(const TempDir& dir, const std::string& file,
                               const std::map<std::string, std::string>& metadata) {
  write_tensors(small_weights(), dir / file, metadata);
  return dir / file;
}

/// Every parameter of `a` bit-identical to the same-named one of `b`.
/// Loading that keeps every parameter's plain values, to compare them.
const ModelLoadOptions kPlain = [] {
  ModelLoadOptions o;
  o.pack = std::nullopt;
  return o;
}();

template <class M>
::testing::AssertionResult same_parameters(const M& a, const M& b) {
  std::map<std::string, const float*> values;
  visit_parameters(b, "", [&](const std::string& name, const auto& p) { values[name] = p.data(); });
  std::size_t compared = 0;
  std::string differing;
  visit_parameters(a, "", [&](const std::string& name, const auto& p) {
    ++compared;
    if (std::memcmp(p.data(), values.at(name), sizeof(float) * std::size_t(p.numel())) != 0 && differing.empty())
      differing = name;
  });
  if (!differing.empty()) return ::testing::AssertionFailure() << "parameter '" << differing << "' differs";
  if (compared != values.size()) return ::testing::AssertionFailure() << "different parameter sets";
  return ::testing::AssertionSuccess();
}

/// The feature model and the token decoder against their model_small dumps.
void expect_small_parity(const LDLM<float>& m) {
  Context ctx;
  const auto tokens =
      read_tensor<std::int64_t, 2>(open_reference("model_small/feature_model.inputs.safetensors"), "tokens");
  expect_matches(m.feature_model.forward(ctx, tokens), open_reference("model_small/feature_model.outputs.safetensors"),
                 "features", kFp32Dump);
  const auto hidden = read_tensor<float, 3>(open_reference("model_small/token_decoder.inputs.safetensors"), "hidden");
  expect_matches(m.token_decoder.forward(ctx, hidden), open_reference("model_small/token_decoder.outputs.safetensors"),
                 "logits", kFp32Dump);
}

// ---------------------------------------------------------------------------
// The configuration in __metadata__
// ---------------------------------------------------------------------------

TEST(CheckpointSelfDescribing, SaveModelStoresTheConfigAndLoadModelNeedsNone) {
  TempDir dir;
  Config c = small_config();
  c.t_min = 0.125;  // a sampling setting, which shapes no tensor, travels too
  c.time_embedding_flip = true;
  LDLM<float> original(c);
  init_parameters(original, 20260501, "", /*pack=*/std::nullopt);  // saving reads the plain values
  save_model(original, dir / "model.safetensors");

  const auto file = SafetensorsFile::open(dir / "model.safetensors");
  ASSERT_EQ(file.metadata().count(kConfigKey), 1u);
  EXPECT_EQ(nlohmann::json::parse(file.metadata().at(kConfigKey)), nlohmann::json(c.to_json()));
  const std::optional<Config> stored = read_config(file);
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->to_json(), c.to_json());
  EXPECT_EQ(resolve_config(file, std::nullopt).to_json(), c.to_json());
  EXPECT_EQ(resolve_config(file, c).to_json(), c.to_json());  // an equal config is fine

  const LDLM<float> loaded = load_model(dir / "model.safetensors", kPlain);
  EXPECT_EQ(loaded.config.to_json(), c.to_json());
  EXPECT_TRUE(same_parameters(original, loaded));
}

TEST(CheckpointSelfDescribing, MismatchNamesEveryDifferingKeyWithBothValues) {
  TempDir dir;
  const std::string path = small_weights_with(dir, "w.safetensors", {{kConfigKey, small_config().to_json().dump()}});
  Config given = small_config();
  given.d_model = 128;
  given.n_heads = 8;
  given.softcap = 30.0;
  given.rotary_interleaved = true;
  const std::string msg = error_of<ConfigError>([&] {
    ModelLoadOptions options;
    options.config = given;
    load_model(path, options);
  });
  EXPECT_THAT(msg, AllOf(HasSubstr(path), HasSubstr("'ldlm.config'"), HasSubstr("in 4 key(s)"),
                         HasSubstr("d_model (given 128, file 64)"), HasSubstr("n_heads (given 8, file 4)"),
                         HasSubstr("softcap (given 30.0, file 50.0)"),
                         HasSubstr("rotary_interleaved (given true, file false)"), Not(HasSubstr("head_dim"))));
}

TEST(CheckpointSelfDescribing, FileWithoutMetadataLoadsWithTheGivenConfigOrAsLdlmBase) {
  const auto file = open_reference("model_small/weights.safetensors");
  ASSERT_EQ(file.metadata().count(kConfigKey), 0u);
  EXPECT_FALSE(read_config(file));
  EXPECT_EQ(resolve_config(file, std::nullopt).to_json(), Config{}.to_json());

  ModelLoadOptions options;
  options.config = small_config();
  expect_small_parity(load_model(file, options));

  // As ldlm-base, the first shape check fails and names both shapes.
  EXPECT_THAT(error_of<CheckpointError>([&] { load_model(file); }),
              AllOf(HasSubstr("feature_model.wte.weight"), HasSubstr("expected shape [50259, 768], got [101, 64]")));
}

TEST(CheckpointSelfDescribing, MalformedConfigIsAConfigErrorNamingFileAndKey) {
  TempDir dir;
  const struct {
    const char* text;
    const char* detail;
  } cases[] = {
      {"{", "not valid JSON"},
      {"", "not valid JSON"},
      {"[64]", "expected a JSON object"},
      {R"({"d_model": "64"})", "'d_model' must be an integer"},
      {R"({"d_model": 64, "d_model": 64})", "duplicate key 'd_model'"},
      {R"({"bogus": 1})", "unknown key 'bogus'"},
      {R"({"n_heads": 5})", "n_heads"},
      {R"({"d_model": {"nested": [1]}})", "'d_model' must be an integer, got a JSON object"},
  };
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    const std::string path =
        small_weights_with(dir, std::to_string(n++) + "_config.safetensors", {{kConfigKey, c.text}});
    const auto file = SafetensorsFile::open(path);
    for (const std::string& msg :
         {error_of<ConfigError>([&] { read_config(file); }), error_of<ConfigError>([&] { load_model(file); })})
      EXPECT_THAT(msg, AllOf(HasSubstr(path), HasSubstr("'ldlm.config'"), HasSubstr("is not a valid configuration"),
                             HasSubstr(c.detail)));
  }
  // A megabyte of junk is quoted only in part.
  const std::string huge = "{\"d_model\": \"" + std::string(1 << 20, 'x');
  const auto file = SafetensorsFile::open(small_weights_with(dir, "huge.safetensors", {{kConfigKey, huge}}));
  EXPECT_LT(error_of<ConfigError>([&] { read_config(file); }).size(), 1000u);
}

// ---------------------------------------------------------------------------
// The generated feature model (ldlm.feature_model_init_seed)
// ---------------------------------------------------------------------------

/// model_small's weights are the generator's with seed 1, so its feature model can be
/// left out of the file and regenerated.
LDLM<float> small_model_seed1() {
  LDLM<float> m(small_config());
  init_parameters(m, 1, "", /*pack=*/std::nullopt);  // saved and compared value by value
  return m;
}

TEST(CheckpointGeneratedFeatureModel, SavedWithoutItsTensorsAndRegeneratedOnLoad) {
  TempDir dir;
  const LDLM<float> original = small_model_seed1();
  ModelSaveOptions save;
  save.feature_model_init_seed = 1;
  save_model(original, dir / "m.safetensors", save);

  const auto file = SafetensorsFile::open(dir / "m.safetensors");
  EXPECT_EQ(file.metadata().at(kSeedKey), "1");
  for (const auto& t : file.tensors()) EXPECT_FALSE(t.name.starts_with("feature_model.")) << t.name;
  EXPECT_EQ(read_feature_model_init_seed(file), std::optional<std::uint64_t>(1));

  const LDLM<float> loaded = load_model(file, kPlain);
  EXPECT_TRUE(same_parameters(original, loaded));
  expect_small_parity(loaded);

  // One module at a time, as the ldlm commands load them.
  LDLM<float> parts(resolve_config(file, std::nullopt));
  load_module(parts, file, "feature_model");
  load_module(parts, file, "token_decoder");
  expect_small_parity(parts);

  // Another seed is another feature model: the seed is really used.
  std::vector<RawTensor> tensors = raw_tensors(file);
  write_tensors(tensors, dir / "seed2.safetensors", {{kConfigKey, small_config().to_json().dump()}, {kSeedKey, "2"}});
  const LDLM<float> other = load_model(dir / "seed2.safetensors");
  Context ctx;
  const auto tokens =
      read_tensor<std::int64_t, 2>(open_reference("model_small/feature_model.inputs.safetensors"), "tokens");
  const auto ref = read_tensor<float, 3>(open_reference("model_small/feature_model.outputs.safetensors"), "features");
  EXPECT_GT(ldlm::test::max_abs_diff(other.feature_model.forward(ctx, tokens), ref), 1e-2);
}

TEST(CheckpointGeneratedFeatureModel, SaveChecksThatTheFeatureModelIsTheGenerators) {
  TempDir dir;
  const LDLM<float> original = small_model_seed1();
  ModelSaveOptions save;
  save.feature_model_init_seed = 2;
  EXPECT_THAT(error_of<InvalidArgument>([&] { save_model(original, dir / "m.safetensors", save); }),
              AllOf(HasSubstr("feature_model.wte.weight"), HasSubstr("feature_model_init_seed 2")));
}

TEST(CheckpointGeneratedFeatureModel, SeedWithStoredFeatureModelTensorsIsRejected) {
  TempDir dir;
  const std::string path =
      small_weights_with(dir, "both.safetensors", {{kConfigKey, small_config().to_json().dump()}, {kSeedKey, "1"}});
  const auto file = SafetensorsFile::open(path);
  const std::string msg = error_of<CheckpointError>([&] { load_model(file); });
  EXPECT_THAT(
      msg, AllOf(HasSubstr(path), HasSubstr("'ldlm.feature_model_init_seed'"), HasSubstr("feature_model tensor(s)")));
  LDLM<float> m(small_config());
  EXPECT_EQ(error_of<CheckpointError>([&] { load_module(m, file, "feature_model"); }), msg);
}

TEST(CheckpointGeneratedFeatureModel, MalformedSeedNamesFileAndKey) {
  TempDir dir;
  int n = 0;
  for (const std::string bad : {"", "-1", "+1", " 1", "1 ", "0x10", "1e3", "18446744073709551616", "seven"}) {
    SCOPED_TRACE("'" + bad + "'");
    const std::string path = small_weights_with(dir, std::to_string(n++) + "_seed.safetensors", {{kSeedKey, bad}});
    const auto file = SafetensorsFile::open(path);
    EXPECT_THAT(error_of<CheckpointError>([&] { read_feature_model_init_seed(file); }),
                AllOf(HasSubstr(path), HasSubstr("'ldlm.feature_model_init_seed' must be a decimal integer"),
                      HasSubstr("got '" + bad + "'")));
  }
  const auto file =
      SafetensorsFile::open(small_weights_with(dir, "max.safetensors", {{kSeedKey, "18446744073709551615"}}));
  EXPECT_EQ(read_feature_model_init_seed(file), std::optional<std::uint64_t>(18446744073709551615ull));
}

// ---------------------------------------------------------------------------
// GPT-2's attention buffers
// ---------------------------------------------------------------------------

TEST(CheckpointGpt2Buffers, ExactNamesOnly) {
  for (const char* name : {"h.0.attn.bias", "h.11.attn.masked_bias", "feature_model.h.2.attn.bias",
                           "feature_model.h.10.attn.masked_bias", "transformer.h.0.attn.bias"})
    EXPECT_TRUE(is_gpt2_buffer(name)) << name;
  for (const char* name :
       {"feature_model.h.0.attn.c_attn.bias", "feature_model.h.0.attn.c_proj.bias", "feature_model.h.0.attn.bias.x",
        "feature_model.h.0.attn.biases", "feature_model.h.x.attn.bias", "feature_model.h..attn.bias",
        "feature_model.h.01.attn.bias", "feature_model.h.-1.attn.bias", "encoder.h.0.attn.bias",
        "feature_model.transformer.h.0.attn.bias", "xh.0.attn.bias", "h.0.attn.bias_", "h.0.mlp.bias", "attn.bias",
        "denoiser.blocks.0.attn.bias"})
    EXPECT_FALSE(is_gpt2_buffer(name)) << name;
}

/// model_small's weights plus GPT-2's buffers of every block under `feature_model.`,
/// the causal mask as BOOL (recent Hugging Face files), and block 0's mask bare in F32
/// (older ones), as full GPT-2 state dicts carry them.
std::vector<RawTensor> small_weights_with_buffers() {
  auto tensors = small_weights();
  const std::int64_t P = small_config().max_positions;
  std::vector<float> causal(std::size_t(P * P), 0.0f);
  for (std::int64_t i = 0; i < P; ++i)
    for (std::int64_t j = 0; j <= i; ++j) causal[std::size_t(i * P + j)] = 1.0f;
  const std::vector<std::uint8_t> causal_bool(causal.begin(), causal.end());
  for (std::int64_t i = 0; i < small_config().gpt2_layers; ++i) {
    const std::string block = "feature_model.h." + std::to_string(i) + ".attn.";
    tensors.push_back({block + "bias", DType::BOOL, {1, 1, P, P}, bytes_of(causal_bool)});
    tensors.push_back({block + "masked_bias", DType::F32, {}, bytes_of(std::vector<float>{-1e4f})});
  }
  tensors.push_back({"h.0.attn.bias", DType::F32, {1, 1, P, P}, bytes_of(causal)});
  return tensors;
}

TEST(CheckpointGpt2Buffers, EveryLoaderIgnoresThem) {
  TempDir dir;
  write_tensors(small_weights_with_buffers(), dir / "buffers.safetensors",
                {{kConfigKey, small_config().to_json().dump()}});
  const auto file = SafetensorsFile::open(dir / "buffers.safetensors");

  expect_small_parity(load_model(file));  // strict whole-model load

  LDLM<float> parts(small_config());  // one module at a time, as the ldlm commands do
  for (const char* name : {"feature_model", "encoder", "latent_decoder", "token_decoder", "denoiser"})
    load_module(parts, file, name);
  expect_small_parity(parts);

  LDLM<float> strict(small_config());  // the generic loader
  load_parameters(strict, file);
  expect_small_parity(strict);
}

TEST(CheckpointGpt2Buffers, ANearMissIsStillUnexpected) {
  TempDir dir;
  auto tensors = small_weights_with_buffers();
  tensors.push_back({"feature_model.h.0.attn.bias_old", DType::F32, {1}, bytes_of(std::vector<float>{1})});
  tensors.push_back({"encoder.h.0.attn.bias", DType::F32, {1}, bytes_of(std::vector<float>{1})});
  write_tensors(tensors, dir / "near.safetensors", {{kConfigKey, small_config().to_json().dump()}});
  const auto file = SafetensorsFile::open(dir / "near.safetensors");
  const std::string msg = error_of<CheckpointError>([&] { load_model(file); });
  EXPECT_THAT(msg, AllOf(HasSubstr("unexpected 2 tensor(s)"), HasSubstr("'encoder.h.0.attn.bias [1]'"),
                         HasSubstr("'feature_model.h.0.attn.bias_old [1]'"), Not(HasSubstr("masked_bias"))));
  LDLM<float> m(small_config());
  EXPECT_THAT(error_of<CheckpointError>([&] { load_module(m, file, "feature_model"); }),
              AllOf(HasSubstr("unexpected 1 tensor(s) under 'feature_model.'"), HasSubstr("attn.bias_old")));
}

// ---------------------------------------------------------------------------
// Quantized checkpoints (ldlm.quantization)
// ---------------------------------------------------------------------------

const std::string kQuantizationKey(kQuantizationMetadataKey);

/// model_small (generator seed 1) written once plain and once quantized; one of its
/// parameters that feeds no product, the first block's norm1 gain, holds bf16 values,
/// so the quantized file stores it as BF16.
struct QuantizedSmall {
  TempDir dir;
  std::string plain = dir / "plain.safetensors", quantized = dir / "int8.safetensors";
  QuantizedSmall() {
    LDLM<float> original = small_model_seed1();
    auto& gain = original.denoiser.blocks[0].norm1.weight;
    round_to_bf16(gain.data(), gain.numel(), gain.data());
    ModelSaveOptions save;
    save.feature_model_init_seed = 1;
    save_model(original, plain, save);
    save.quantize_int8 = true;
    save_model(original, quantized, save);
  }
};

const std::string kBf16Gain = "denoiser.blocks.0.norm1.weight";

/// The names of the matrix-product weights int8 quantizes, and of the other ones.
std::pair<std::set<std::string>, std::set<std::string>> matmul_weight_names() {
  std::set<std::string> quantized, other;
  const LDLM<float> shapes(small_config());
  visit_parameters(shapes, "", [&](const std::string& name, const auto& p) {
    if constexpr (requires { p.quantized_at_int8(); }) (p.quantized_at_int8() ? quantized : other).insert(name);
  });
  return {quantized, other};
}

TEST(CheckpointQuantized, StoresTheQuantizedMapsAsI8WithPerChannelScalesAndTheRestAsInt8UsesIt) {
  const QuantizedSmall files;
  const auto file = SafetensorsFile::open(files.quantized), plain = SafetensorsFile::open(files.plain);
  EXPECT_EQ(file.metadata().at(kQuantizationKey), "int8");
  const auto [maps, other_weights] = matmul_weight_names();
  EXPECT_EQ(maps.size(), std::size_t(test::int8_weight_count(small_config())));
  for (const std::string& name : maps) EXPECT_TRUE(test::quantized_at_int8(name)) << name;
  for (const std::string& name : maps) {
    const TensorInfo& values = file.info(name);
    const TensorInfo& scales = file.info(name + ".scale");
    EXPECT_EQ(values.dtype, DType::I8) << name;
    EXPECT_EQ(values.shape, plain.info(name).shape) << name;
    EXPECT_EQ(scales.dtype, DType::F32) << name;
    EXPECT_EQ(scales.shape, Shape{values.shape[0]}) << name << ": one scale per output channel";
    // The one quantization of weights, bit for bit.
    const std::vector<float> w = plain.read<float>(name);
    const S8Weight q =
        quantize_channels(ConstMatrixMap<float>(w.data(), values.shape[0], values.shape[1]), WeightLayout::out_in);
    const auto stored = file.bytes(name);
    EXPECT_EQ(std::memcmp(stored.data(), q.values.data(), q.values.size()), 0) << name;
    EXPECT_EQ(file.read<float>(name + ".scale"), q.scales) << name;
  }
  for (const TensorInfo& t : plain.tensors()) {
    if (maps.count(t.name)) continue;
    std::vector<float> want = plain.read<float>(t.name);
    if (other_weights.count(t.name)) {  // what int8 packs them as: bf16, rounded to nearest even
      EXPECT_EQ(file.info(t.name).dtype, DType::BF16) << t.name;
      round_to_bf16(want.data(), static_cast<std::int64_t>(want.size()), want.data());
    } else {  // lossless: BF16 only where every value is one
      EXPECT_EQ(file.info(t.name).dtype, t.name == kBf16Gain ? DType::BF16 : DType::F32) << t.name;
    }
    EXPECT_EQ(file.read<float>(t.name), want) << t.name;
  }
  EXPECT_EQ(file.tensors().size(), plain.tensors().size() + maps.size());
}

/// x0 of the denoiser on fixed inputs.
Tensor3<float> denoise(const LDLM<float>& m) {
  const Index B = 2, T = 12, d = m.config.d_model;
  Tensor3<float> x_t(B, T, d), self_cond(B, T, d);
  for (Index i = 0; i < x_t.size(); ++i) {
    x_t.data()[i] = std::sin(0.37f * static_cast<float>(i));
    self_cond.data()[i] = std::cos(0.11f * static_cast<float>(i));
  }
  Tensor1<float> t(B);
  t.setValues({0.3f, 0.8f});
  Context ctx(2);
  return m.denoiser.forward(ctx, x_t, t, self_cond);
}

bool same_values(const Tensor3<float>& a, const Tensor3<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * std::size_t(a.size())) == 0;
}

ModelLoadOptions packed_for(Precision precision) {
  ModelLoadOptions o;
  o.pack = precision;
  return o;
}

TEST(CheckpointQuantized, AtInt8GivesTheOutputsOfQuantizingAtLoadBitForBit) {
  if (!int8_unavailable_reason().empty()) GTEST_SKIP() << int8_unavailable_reason();
  const QuantizedSmall files;
  const LDLM<float> at_load = load_model(files.plain, packed_for(Precision::int8));
  const LDLM<float> stored = load_model(files.quantized, packed_for(Precision::int8));
  EXPECT_EQ(stored.denoiser.blocks[0].mlp.fc1.weight.packed()->path(), ProductPath::int8_native);
  const Tensor3<float> x0 = denoise(at_load);
  EXPECT_TRUE(same_values(denoise(stored), x0)) << "denoiser x0 from the quantized file differs";
  // It is int8 at all: fp32 gives other values.
  EXPECT_FALSE(same_values(denoise(load_model(files.plain, kPlain)), x0));

  SamplerOptions options;
  options.steps = 3;
  options.seed = 5;
  Context ctx(2);
  const TokenTensor want = Pipeline<float>(at_load).generate(ctx, 2, 10, options);
  const TokenTensor got = Pipeline<float>(stored).generate(ctx, 2, 10, options);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(std::int64_t) * std::size_t(want.size())), 0)
      << "generate from the quantized file differs";
}

TEST(CheckpointQuantized, AtFp32AndBf16TheWeightsAreDequantized) {
  const QuantizedSmall files;
  const auto file = SafetensorsFile::open(files.quantized);
  const LDLM<float> m = load_model(file, kPlain);
  const auto& fc1 = m.denoiser.blocks[1].mlp.fc1.weight;
  const std::string name = "denoiser.blocks.1.mlp.0.weight";
  const auto values = file.bytes(name);
  const std::vector<float> scales = file.read<float>(name + ".scale");
  const ConstMatrixMap<float> w = fc1.matrix();
  // Compared for equality, not by a difference, which the compiler may fuse with the
  // product into one FMA (exact, so it shows the product's rounding).
  Index differing = 0, first_r = -1, first_c = -1;
  for (Index r = 0; r < w.rows(); ++r)
    for (Index c = 0; c < w.cols(); ++c) {
      const float want = static_cast<float>(static_cast<std::int8_t>(values[r * w.cols() + c])) * scales[r];
      if (w(r, c) != want && differing++ == 0) first_r = r, first_c = c;
    }
  EXPECT_EQ(differing, 0) << name << ": weight = value · its output channel's scale, exactly; first differing ["
                          << first_r << ", " << first_c << "]";
  // bf16 packs the dequantized weights: the same as packing them from a plain file.
  EXPECT_NO_THROW(load_model(file, packed_for(Precision::bf16)));
}

/// The quantized file with `edit` applied to its tensors, and `metadata` changed.
std::string corrupted(const QuantizedSmall& files, const std::string& out,
                      const std::function<void(std::vector<RawTensor>&)>& edit,
                      std::map<std::string, std::string> metadata = {}) {
  const auto file = SafetensorsFile::open(files.quantized);
  std::vector<RawTensor> tensors = raw_tensors(file);
  edit(tensors);
  std::map<std::string, std::string> all = file.metadata();
  for (const auto& [k, v] : metadata) {
    if (v.empty())
      all.erase(k);
    else
      all[k] = v;
  }
  const std::string path = files.dir / out;
  write_tensors(tensors, path, all);
  return path;
}

TEST(CheckpointQuantized, CorruptFilesAreRefusedNamingTheTensorExpectedAndFound) {
  const QuantizedSmall files;
  const std::string w = "denoiser.blocks.1.attn_out.weight", scale = w + ".scale";
  const Index d = small_config().d_model;
  auto refused = [&](const std::string& path) { return error_of<CheckpointError>([&] { load_model(path, kPlain); }); };
  // The weight in F32 where the file says the blocks' maps are quantized.
  EXPECT_THAT(refused(corrupted(files, "f32.safetensors",
                                [&](auto& t) {
                                  RawTensor& r = find_tensor(t, w);
                                  r.dtype = DType::F32;
                                  r.bytes = bytes_of(std::vector<float>(std::size_t(d * d), 0.5f));
                                  t.erase(std::find_if(t.begin(), t.end(), [&](auto& x) { return x.name == scale; }));
                                })),
              AllOf(HasSubstr("'" + w + "'"), HasSubstr("has dtype F32, expected I8"), HasSubstr("ldlm.quantization")));
  // Scales in I8, in the wrong shape, missing.
  EXPECT_THAT(refused(corrupted(files, "i8scale.safetensors",
                                [&](auto& t) {
                                  RawTensor& r = find_tensor(t, scale);
                                  r.dtype = DType::I8;
                                  r.bytes.resize(std::size_t(d));
                                })),
              AllOf(HasSubstr("'" + scale + "'"), HasSubstr("expected F32 [" + std::to_string(d) + "], got I8 [")));
  EXPECT_THAT(refused(corrupted(files, "shape.safetensors",
                                [&](auto& t) {
                                  RawTensor& r = find_tensor(t, scale);
                                  r.shape = {d - 1};
                                  r.bytes.resize(std::size_t(d - 1) * sizeof(float));
                                })),
              AllOf(HasSubstr("'" + scale + "'"),
                    HasSubstr("expected F32 [" + std::to_string(d) + "], got F32 [" + std::to_string(d - 1) + "]")));
  EXPECT_THAT(refused(corrupted(files, "missing.safetensors",
                                [&](auto& t) {
                                  t.erase(std::find_if(t.begin(), t.end(), [&](auto& x) { return x.name == scale; }));
                                })),
              AllOf(HasSubstr("'" + w + "'"), HasSubstr("'" + scale + "' are missing"),
                    HasSubstr("expected F32 [" + std::to_string(d) + "]")));
  // I8 without the metadata, a bad metadata value, and an I8 tensor int8 never quantizes.
  EXPECT_THAT(refused(corrupted(files, "nometa.safetensors", [](auto&) {}, {{kQuantizationKey, ""}})),
              AllOf(HasSubstr("has dtype I8"), HasSubstr("no 'ldlm.quantization'")));
  EXPECT_THAT(refused(corrupted(files, "int4.safetensors", [](auto&) {}, {{kQuantizationKey, "int4"}})),
              HasSubstr("'ldlm.quantization' must be 'int8', got 'int4'"));
  EXPECT_THAT(refused(corrupted(files, "ada.safetensors",
                                [&](auto& t) {
                                  RawTensor& r = find_tensor(t, "denoiser.blocks.0.adaLN_modulation.weight");
                                  r.dtype = DType::I8;
                                  r.bytes.resize(r.bytes.size() / 2);
                                })),
              AllOf(HasSubstr("'denoiser.blocks.0.adaLN_modulation.weight' has dtype I8"),
                    HasSubstr("only the weights int8 quantizes")));
  // A scale whose weight is not quantized claims nothing: an unexpected tensor.
  EXPECT_THAT(
      refused(corrupted(
          files, "stray.safetensors",
          [&](auto& t) {
            t.push_back({"denoiser.blocks.0.norm1.weight.scale", DType::F32, {1}, bytes_of(std::vector<float>{1})});
          })),
      HasSubstr("unexpected 1 tensor(s)"));
}

TEST(CheckpointQuantized, ADoubleModelCannotBeWrittenQuantized) {
  TempDir dir;
  LDLM<double> m(small_config());
  init_parameters(m, 1, "", std::nullopt);
  ModelSaveOptions save;
  save.quantize_int8 = true;
  EXPECT_THAT(error_of<InvalidArgument>([&] { save_model(m, dir / "d.safetensors", save); }),
              HasSubstr("needs a float model"));
}

TEST(CheckpointModuleByName, UnknownNameIsAnInvalidArgument) {
  LDLM<float> m(small_config());
  const auto file = open_reference("model_small/weights.safetensors");
  EXPECT_THAT(error_of<InvalidArgument>([&] { load_module(m, file, "decoder"); }),
              AllOf(HasSubstr("unknown module 'decoder'"), HasSubstr("token_decoder")));
}

}  // namespace
}  // namespace unit_model_checkpoint
