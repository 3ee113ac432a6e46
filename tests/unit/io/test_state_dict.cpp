// Loading and saving by state-dict name (io/state_dict.hpp): a bit-exact save/load round
// trip, loading errors (truncated, renamed, transposed and integer tensors), one module from
// the full checkpoint, Hugging Face GPT-2 names, half and bfloat16 files widened to float.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/files.hpp"
#include "support/reference.hpp"
#include "support/modules.hpp"

namespace unit_io_state_dict {
namespace {

using ldlm::test::bytes_of;
using ldlm::test::error_of;
using ldlm::test::find_tensor;
using ldlm::test::raw_tensors;
using ldlm::test::RawTensor;
using ldlm::test::TempDir;
using ldlm::test::values_of;
using ldlm::test::write_tensors;

using namespace ldlm;
using ldlm::test::data_path;
using ldlm::test::expect_matches_logging_scaled_error;
using ldlm::test::kFp32Dump;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::small_config;
using ldlm::test::small_model;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

/// float -> IEEE binary16, round to nearest even (overflow to inf, subnormals kept).
std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return std::uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // >= 65520 rounds past 65504
  if (a < 0x38800000u)  // below 2^-14: a subnormal half, in units of 2^-24 (exact scaling)
    return std::uint16_t(sign | std::uint32_t(std::nearbyint(std::bit_cast<float>(a) * 16777216.0f)));
  const std::uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15
  return std::uint16_t(sign | (rounded >> 13));
}

/// float -> bfloat16, round to nearest even.
std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((x >> 16) | 0x40u);
  return std::uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

TEST(StateDict, SaveLoadRoundTripIsBitExact) {
  TempDir dir;
  LDLM<float> original(small_config());
  init_parameters(original, 20260501, "", /*pack=*/std::nullopt);
  save_parameters(original, dir / "model.safetensors");
  pack_parameters(original, Precision::fp32);  // as load_parameters does

  LDLM<float> loaded(small_config());
  load_parameters(loaded, SafetensorsFile::open(dir / "model.safetensors"));

  Context ctx;
  const auto den_in = open_reference("model_small/denoiser.inputs.safetensors");
  const auto x_t = read_tensor<float, 3>(den_in, "x_t"), self_cond = read_tensor<float, 3>(den_in, "self_cond");
  const auto t = read_tensor<float, 1>(den_in, "t");
  const auto a = original.denoiser.forward(ctx, x_t, t, self_cond), b = loaded.denoiser.forward(ctx, x_t, t, self_cond);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * std::size_t(a.size())), 0);

  const auto hidden = read_tensor<float, 3>(open_reference("model_small/token_decoder.inputs.safetensors"), "hidden");
  const auto la = original.token_decoder.forward(ctx, hidden), lb = loaded.token_decoder.forward(ctx, hidden);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), sizeof(float) * std::size_t(la.size())), 0);

  // A different seed gives a different model (the round trip is not vacuous).
  const auto reference = small_model<float>().denoiser.forward(ctx, x_t, t, self_cond);
  EXPECT_GT(ldlm::test::max_abs_diff(a, reference), 1e-2);
}

class StateDictLoading : public ::testing::Test {
 protected:
  std::string weights_path() const { return data_path("model_small/weights.safetensors"); }
  std::vector<RawTensor> weights() const { return raw_tensors(SafetensorsFile::open(weights_path())); }
  std::string load_error(const std::string& path) const {
    return error_of<CheckpointError>([&] {
      LDLM<float> m(small_config());
      load_parameters(m, SafetensorsFile::open(path));
    });
  }
  TempDir dir_;
};

TEST_F(StateDictLoading, TruncatedCheckpointNamesTheFirstTensorPastTheEnd) {
  const std::string cut = dir_ / "truncated.safetensors";
  fs::copy_file(weights_path(), cut);
  const auto full_size = fs::file_size(cut);
  fs::resize_file(cut, full_size / 2);

  // The header survives; the reader names the first tensor (in name order) whose
  // bytes now lie past the end.
  const auto original = SafetensorsFile::open(weights_path());
  std::uint64_t data_bytes = 0;
  for (const auto& t : original.tensors()) data_bytes = std::max(data_bytes, t.offset + t.size);
  const std::uint64_t data_left = full_size / 2 - (full_size - data_bytes);
  std::string first_cut;
  for (const auto& t : original.tensors())
    if (t.offset + t.size > data_left) {
      first_cut = t.name;
      break;
    }
  ASSERT_FALSE(first_cut.empty());
  const std::string msg = error_of<FormatError>([&] { SafetensorsFile::open(cut); });
  EXPECT_THAT(msg, AllOf(HasSubstr(cut), HasSubstr("'" + first_cut + "'"), HasSubstr("outside the data section")));
}

TEST_F(StateDictLoading, RenamedTensorIsMissingAndUnexpected) {
  auto tensors = weights();
  find_tensor(tensors, "denoiser.input_proj.weight").name = "denoiser.input_projection.weight";
  write_tensors(tensors, dir_ / "renamed.safetensors");
  // One message names both sides of the rename.
  EXPECT_THAT(load_error(dir_ / "renamed.safetensors"),
              AllOf(HasSubstr(dir_ / "renamed.safetensors"), HasSubstr("missing 1 tensor(s)"),
                    HasSubstr("'denoiser.input_proj.weight [64, 128]'"), HasSubstr("unexpected 1 tensor(s)"),
                    HasSubstr("'denoiser.input_projection.weight [64, 128]'")));

  // With the missing tensor present again, only the stray one is reported.
  tensors.push_back(find_tensor(tensors, "denoiser.input_projection.weight"));
  tensors.back().name = "denoiser.input_proj.weight";
  write_tensors(tensors, dir_ / "extra.safetensors");
  const std::string msg = load_error(dir_ / "extra.safetensors");
  EXPECT_THAT(msg, AllOf(HasSubstr("unexpected 1 tensor(s) that no parameter claims: "
                                   "'denoiser.input_projection.weight [64, 128]'"),
                         Not(HasSubstr("missing"))));
}

TEST_F(StateDictLoading, TransposedWeightNamesBothShapes) {
  auto tensors = weights();
  RawTensor& w = find_tensor(tensors, "denoiser.input_proj.weight");
  ASSERT_EQ(w.shape, (Shape{64, 128}));
  const auto v = values_of<float>(w);
  std::vector<float> transposed(v.size());
  for (std::size_t r = 0; r < 64; ++r)
    for (std::size_t c = 0; c < 128; ++c) transposed[c * 64 + r] = v[r * 128 + c];
  w.shape = {128, 64};
  w.bytes = bytes_of(transposed);
  write_tensors(tensors, dir_ / "transposed.safetensors");
  EXPECT_THAT(load_error(dir_ / "transposed.safetensors"),
              HasSubstr("tensor 'denoiser.input_proj.weight' expected shape [64, 128], got [128, 64]"));
}

// GPT-2's attn.c_proj is a square Conv1D weight [in, out] = [d, d]: a checkpoint
// holding it transposed (nn.Linear's [out, in] order, the classic porting slip)
// passes every shape check and loads silently. Parity is what catches it: the
// features land far outside the tolerance.
TEST_F(StateDictLoading, TransposedSquareConv1DWeightsLoadButMissTheReference) {
  auto tensors = weights();
  int transposed_count = 0;
  for (int layer = 0; layer < small_config().gpt2_layers; ++layer) {
    RawTensor& w = find_tensor(tensors, "feature_model.h." + std::to_string(layer) + ".attn.c_proj.weight");
    ASSERT_EQ(w.shape, (Shape{64, 64}));
    const auto v = values_of<float>(w);
    std::vector<float> transposed(v.size());
    for (std::size_t r = 0; r < 64; ++r)
      for (std::size_t c = 0; c < 64; ++c) transposed[c * 64 + r] = v[r * 64 + c];
    ASSERT_NE(transposed, v);
    w.bytes = bytes_of(transposed);
    ++transposed_count;
  }
  ASSERT_EQ(transposed_count, 3);
  write_tensors(tensors, dir_ / "transposed_c_proj.safetensors");

  LDLM<float> m(small_config());
  ASSERT_NO_THROW(load_parameters(m, SafetensorsFile::open(dir_ / "transposed_c_proj.safetensors")));
  const auto in = open_reference("model_small/feature_model.inputs.safetensors");
  const auto out = open_reference("model_small/feature_model.outputs.safetensors");
  Context ctx;
  const auto features = m.feature_model.forward(ctx, read_tensor<std::int64_t, 2>(in, "tokens"));
  EXPECT_FALSE(ldlm::test::matches_reference(features, out, "features", kFp32Dump));
  // Far outside: at least 100 times the tolerance.
  const double error = ldlm::test::max_abs_diff(features, read_tensor<float, 3>(out, "features"));
  ::testing::Test::RecordProperty("features.max_abs_error_transposed", std::to_string(error));
  EXPECT_GT(error, 100 * kFp32Dump.atol);
}

TEST_F(StateDictLoading, IntegerWeightIsRejected) {
  auto tensors = weights();
  RawTensor& b = find_tensor(tensors, "denoiser.time_emb.0.bias");
  b.dtype = DType::I64;
  b.bytes = bytes_of(std::vector<std::int64_t>(b.bytes.size() / sizeof(float), 1));
  write_tensors(tensors, dir_ / "int.safetensors");
  EXPECT_THAT(load_error(dir_ / "int.safetensors"),
              AllOf(HasSubstr("'denoiser.time_emb.0.bias'"), HasSubstr("I64"), HasSubstr("floating")));
}

TEST_F(StateDictLoading, OneModuleFromTheFullCheckpoint) {
  const auto file = SafetensorsFile::open(weights_path());
  Denoiser<float> denoiser(small_config());
  load_parameters(denoiser, file, "denoiser.", LoadOptions::scoped("denoiser."));

  const auto in = open_reference("model_small/denoiser.inputs.safetensors");
  const auto out = open_reference("model_small/denoiser.outputs.safetensors");
  Context ctx;
  expect_matches_logging_scaled_error(
      denoiser.forward(ctx, read_tensor<float, 3>(in, "x_t"), read_tensor<float, 1>(in, "t"),
                       read_tensor<float, 3>(in, "self_cond")),
      out, "x0", kFp32Dump);

  // Without the scope, every other module's tensors are unexpected.
  const std::string msg = error_of<CheckpointError>([&] {
    Denoiser<float> strict(small_config());
    load_parameters(strict, file, "denoiser.");
  });
  EXPECT_THAT(msg, AllOf(HasSubstr("tensor(s) that no parameter claims: "), HasSubstr("'encoder.")));
}

/// The feature model's tensors in Hugging Face GPT2LMHeadModel layout: `prefix` on
/// every name, the attention-mask buffers of block 0 and a tied lm_head.
std::vector<RawTensor> hf_gpt2_tensors(const std::vector<RawTensor>& weights, const std::string& prefix) {
  std::vector<RawTensor> out;
  const std::string ours = "feature_model.";
  for (const auto& t : weights)
    if (t.name.starts_with(ours)) out.push_back({prefix + t.name.substr(ours.size()), t.dtype, t.shape, t.bytes});
  const std::int64_t P = small_config().max_positions;
  std::vector<float> causal(std::size_t(P * P), 0.0f);
  for (std::int64_t i = 0; i < P; ++i)
    for (std::int64_t j = 0; j <= i; ++j) causal[std::size_t(i * P + j)] = 1.0f;
  out.push_back({prefix + "h.0.attn.bias", DType::F32, {1, 1, P, P}, bytes_of(causal)});
  out.push_back({prefix + "h.0.attn.masked_bias", DType::F32, {}, bytes_of(std::vector<float>{-1e4f})});
  for (const auto& t : weights)
    if (t.name == ours + "wte.weight") out.push_back({"lm_head.weight", t.dtype, t.shape, t.bytes});
  return out;
}

TEST_F(StateDictLoading, HuggingFaceGpt2WithAndWithoutTransformerPrefix) {
  const auto in = open_reference("model_small/feature_model.inputs.safetensors");
  const auto out = open_reference("model_small/feature_model.outputs.safetensors");
  const auto tokens = read_tensor<std::int64_t, 2>(in, "tokens");
  for (const std::string prefix : {"transformer.", ""}) {
    SCOPED_TRACE("prefix '" + prefix + "'");
    const std::string path = dir_ / (prefix.empty() ? "gpt2_plain.safetensors" : "gpt2_prefixed.safetensors");
    write_tensors(hf_gpt2_tensors(weights(), prefix), path);
    GPT2Features<float> gpt2(small_config());
    load_hf_gpt2(gpt2, SafetensorsFile::open(path));
    Context ctx;
    expect_matches_logging_scaled_error(gpt2.forward(ctx, tokens), out, "features", kFp32Dump);
  }
}

TEST_F(StateDictLoading, HalfAndBfloat16CheckpointsWidenToFloat) {
  struct Narrow {
    const char* label;
    DType dtype;
    std::uint16_t (*round)(float);
    float (*widen)(std::uint16_t);
    double relative;  // half a unit in the last place
    double absolute;  // half the smallest subnormal step
  };
  const Narrow kinds[] = {{"F16", DType::F16, float_to_half, half_to_float, std::ldexp(1.0, -11), std::ldexp(1.0, -25)},
                          {"BF16", DType::BF16, float_to_bf16, [](std::uint16_t h) { return bf16_to_float(bf16(h)); },
                           std::ldexp(1.0, -8), 0.0}};
  LoadOptions plain;
  plain.pack = std::nullopt;  // the values themselves are compared
  LDLM<float> original(small_config());
  load_parameters(original, SafetensorsFile::open(weights_path()), "", plain);
  for (const Narrow& k : kinds) {
    SCOPED_TRACE(k.label);
    auto tensors = weights();
    for (auto& t : tensors) {
      const auto v = values_of<float>(t);
      std::vector<std::uint16_t> narrow(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) narrow[i] = k.round(v[i]);
      t.dtype = k.dtype;
      t.bytes = bytes_of(narrow);
    }
    const std::string path = dir_ / (std::string(k.label) + ".safetensors");
    write_tensors(tensors, path);
    LDLM<float> loaded(small_config());
    load_parameters(loaded, SafetensorsFile::open(path), "", plain);

    std::map<std::string, const float*> loaded_values;
    visit_parameters(loaded, "", [&](const std::string& name, const auto& p) { loaded_values[name] = p.data(); });
    std::int64_t checked = 0;
    visit_parameters(original, "", [&](const std::string& name, const auto& want) {
      const float* got = loaded_values.at(name);
      for (std::int64_t i = 0; i < want.numel(); ++i) {
        const float w = want.data()[i];
        ASSERT_EQ(got[i], k.widen(k.round(w))) << name << "[" << i << "]";
        ASSERT_LE(std::abs(double(got[i]) - w), k.relative * std::abs(w) + k.absolute) << name << "[" << i << "]";
      }
      ++checked;
    });
    EXPECT_EQ(checked, std::int64_t(tensors.size()));
  }
}

}  // namespace
}  // namespace unit_io_state_dict
