// bf16 model parity: every module of model_small and model_base in ldlm's bf16 mode against
// three dumps each (tools/reference/generate.py): fp32; `.bf16`, ldlm's bf16 mode computed by
// the PyTorch reference (operands of every product rounded to bf16, fp32 elsewhere);
// `.autocast_bf16`, torch.autocast, whose metadata holds autocast's own error against fp32.
//
// Tolerances: against `.bf16`, kBf16Module below: ldlm and PyTorch compute fp32 activations
// that differ in their last bits (sum order, exp/tanh implementations), and a few of them
// round to neighbouring bf16 values before the next product. Each such flip moves one
// product term by 2^-8 of itself; deeper modules compound more of them, and kernels with
// another summation order (AMX against AVX512_BF16) flip other operands. The bounds are
// about 3x the largest error seen (recorded as test properties) for the chain and at real
// width, 1.8x (AMX) to 7x (AVX512_BF16) for the small single modules, and 10-100x below the
// error of a LayerNorm computed in bf16 (the bug these tests exist to catch). Against fp32
// and autocast: ldlm's error, max |ldlm − fp32| / max |fp32|, must not exceed autocast's own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "ldlm/ldlm.hpp"
#include "support/modules.hpp"
#include "support/reference.hpp"

namespace parity_bf16_model {
namespace {

using namespace ldlm;
using ldlm::test::data_path;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;

/// See the header. Largest single-module errors seen, max |error| / (1 + |ref|), on
/// the Intel Xeon with AMX (2026-12-01): AMX kernels 3.3e-3 (the small latent decoder:
/// their other summation order flips one more operand there, 3.6e-3 at |ref| 0.08,
/// which this bound allows 1.8x over); the same CPU capped at AVX512_BF16 kernels
/// 8.5e-4 (the denoiser), 7x below. A LayerNorm computed in bf16 moves the small
/// denoiser by 0.26, 40x this bound.
constexpr Tolerance kBf16Module{6e-3, 6e-3};
constexpr Tolerance kBf16Chain{2.5e-2, 2.5e-2};
constexpr Tolerance kBf16Deep{4e-2, 4e-2};

double max_abs(const Tensor3<float>& t) {
  double m = 0;
  for (Index i = 0; i < t.size(); ++i) m = std::max(m, std::abs(double(t.data()[i])));
  return m;
}

double max_abs_error(const Tensor3<float>& a, const Tensor3<float>& b) {
  double err = 0;
  for (Index i = 0; i < a.size(); ++i) err = std::max(err, std::abs(double(a.data()[i]) - b.data()[i]));
  return err;
}

struct Bf16Case {
  const char* model_dir;  // under tests/data
  const char* module;
  Tolerance tolerance;  // against the `.bf16` dump
};

std::string case_name(const ::testing::TestParamInfo<Bf16Case>& info) {
  return std::string(info.param.model_dir) + "_" + info.param.module;
}

/// One bf16 model per reference directory, each module built the first time a test
/// needs it: model_small loads its committed weights, model_base generates them from
/// the inputs' init_seed (nothing committed at the real width).
class Bf16Model : public ::testing::TestWithParam<Bf16Case> {
 protected:
  static void TearDownTestSuite() { models_.clear(); }

  static const LDLM<float>& model(const std::string& dir, const std::string& module, const SafetensorsFile& inputs) {
    auto& entry = models_[dir];
    if (!entry.model) entry.model = std::make_unique<LDLM<float>>(Config::load(data_path(dir + "/config.json")));
    for (const std::string& name : ldlm::test::modules_run_by(module)) {
      if (!entry.ready.insert(name).second) continue;
      with_module(*entry.model, name, [&](auto& m) {
        if (dir == "model_small") {
          LoadOptions options = LoadOptions::scoped(name + ".");
          options.pack = Precision::bf16;
          load_parameters(m, open_reference(dir + "/weights.safetensors"), name + ".", options);
        } else {
          init_parameters(m, std::stoull(inputs.metadata().at("init_seed")), name + ".", Precision::bf16);
        }
      });
    }
    return *entry.model;
  }

 private:
  struct Entry {
    std::unique_ptr<LDLM<float>> model;
    std::set<std::string> ready;
  };
  static inline std::map<std::string, Entry> models_;
};

double rms_error(const Tensor3<float>& got, const Tensor3<float>& ref) {
  double err = 0, norm = 0;
  for (Index i = 0; i < ref.size(); ++i) {
    const double r = ref.data()[i];
    err += (got.data()[i] - r) * (got.data()[i] - r);
    norm += r * r;
  }
  return std::sqrt(err / norm);
}

TEST_P(Bf16Model, MatchesTheBf16ReferenceAndIsCloserToFp32ThanAutocast) {
  const Bf16Case& c = GetParam();
  const std::string dir = c.model_dir, module = c.module;
  const auto in = open_reference(dir + "/" + module + ".inputs.safetensors");
  const auto fp32 = open_reference(dir + "/" + module + ".outputs.safetensors");
  const auto exact = open_reference(dir + "/" + module + ".outputs.bf16.safetensors");
  const auto autocast = open_reference(dir + "/" + module + ".outputs.autocast_bf16.safetensors");
  Context ctx(2);
  for (const auto& [name, got] : ldlm::test::run_module(ctx, model(dir, module, in), module, in)) {
    SCOPED_TRACE(name);
    const auto want_exact = read_tensor<float, 3>(exact, name);
    const auto want_fp32 = read_tensor<float, 3>(fp32, name);
    const auto want_autocast = read_tensor<float, 3>(autocast, name);
    double max_scaled = 0;
    for (Index i = 0; i < got.size(); ++i)
      max_scaled = std::max(
          max_scaled, std::abs(double(got.data()[i]) - want_exact.data()[i]) / (1 + std::abs(want_exact.data()[i])));
    const double scale = max_abs(want_fp32);
    const double ldlm_rms = rms_error(got, want_fp32), autocast_rms = rms_error(want_autocast, want_fp32);
    const double ldlm_max = max_abs_error(got, want_fp32) / scale,
                 autocast_max = max_abs_error(want_autocast, want_fp32) / scale;
    std::ostringstream observed;
    observed << std::setprecision(3) << "vs .bf16: max |error|/(1+|ref|) " << max_scaled << "; vs fp32: ldlm-bf16 rms "
             << ldlm_rms << ", autocast rms " << autocast_rms << ", ldlm-bf16 max " << ldlm_max << ", autocast max "
             << autocast_max;
    ::testing::Test::RecordProperty(name + ".bf16", observed.str());
    std::printf("BF16 %s/%s %s: %s\n", dir.c_str(), module.c_str(), name.c_str(), observed.str().c_str());
    EXPECT_TRUE(ldlm::test::matches_reference(got, exact, name, c.tolerance));
    EXPECT_LE(ldlm_rms, autocast_rms) << observed.str();
    EXPECT_GT(ldlm_rms, 0.0) << "bf16 output equals fp32: the mode did not run";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dumps, Bf16Model,
    ::testing::Values(
        Bf16Case{"model_small", "feature_model", kBf16Module}, Bf16Case{"model_small", "encoder", kBf16Module},
        Bf16Case{"model_small", "latent_decoder", kBf16Module}, Bf16Case{"model_small", "token_decoder", kBf16Module},
        Bf16Case{"model_small", "denoiser", kBf16Module}, Bf16Case{"model_small", "reconstruct", kBf16Chain},
        Bf16Case{"model_base", "feature_model", kBf16Deep}, Bf16Case{"model_base", "encoder", kBf16Deep},
        Bf16Case{"model_base", "latent_decoder", kBf16Deep}, Bf16Case{"model_base", "token_decoder", kBf16Deep},
        Bf16Case{"model_base", "denoiser", kBf16Deep}, Bf16Case{"model_base", "reconstruct", kBf16Deep}),
    case_name);

}  // namespace
}  // namespace parity_bf16_model
