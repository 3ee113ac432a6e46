// Input validation at the API boundary (model/common.hpp): token ids, sequence lengths,
// feature widths, the denoiser's self_cond and t, the optional finite check, and unloaded
// parameters.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "ldlm/ldlm.hpp"
#include "support/files.hpp"
#include "support/reference.hpp"
#include "support/modules.hpp"

namespace unit_model_common {
namespace {

using ldlm::test::error_of;

using namespace ldlm;
using ldlm::test::data_path;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::small_config;
using ldlm::test::small_model;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(CommonInputs, TokenIdsOutsideTheVocabularyNameThePosition) {
  const auto& m = small_model<float>();
  auto tokens = read_tensor<std::int64_t, 2>(open_reference("model_small/feature_model.inputs.safetensors"), "tokens");
  Context ctx;
  tokens(1, 3) = 101;  // = V
  EXPECT_THAT(
      error_of<InvalidArgument>([&] { m.feature_model.forward(ctx, tokens); }),
      AllOf(HasSubstr("feature_model"), HasSubstr("'tokens'"), HasSubstr("id 101 at [1, 3]"), HasSubstr("[0, 101)")));
  tokens(1, 3) = 0;
  tokens(0, 36) = -1;
  EXPECT_THAT(error_of<InvalidArgument>([&] { m.feature_model.forward(ctx, tokens); }),
              AllOf(HasSubstr("'tokens'"), HasSubstr("id -1 at [0, 36]")));
}

TEST(CommonInputs, SequenceLengthMustBeOneToMaxPositions) {
  const auto& m = small_model<float>();
  Context ctx;
  EXPECT_THAT(error_of<ShapeError>([&] { m.feature_model.forward(ctx, TokenTensor(2, 0)); }),
              AllOf(HasSubstr("feature_model"), HasSubstr("'tokens'"), HasSubstr("[2, 0]")));
  TokenTensor too_long(1, 49);
  too_long.setZero();
  EXPECT_THAT(error_of<ShapeError>([&] { m.feature_model.forward(ctx, too_long); }),
              AllOf(HasSubstr("'tokens'"), HasSubstr("[1, 49]"), HasSubstr("max_positions = 48")));

  Tensor3<float> empty(2, 0, 64), long_latents(1, 49, 64);
  long_latents.setZero();
  EXPECT_THAT(error_of<ShapeError>([&] { m.encoder.forward(ctx, empty); }),
              AllOf(HasSubstr("encoder"), HasSubstr("'features'"), HasSubstr("[2, 0, 64]")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.latent_decoder.forward(ctx, long_latents); }),
              AllOf(HasSubstr("latent_decoder"), HasSubstr("'latents'"), HasSubstr("max_positions = 48")));
  Tensor1<float> t(1);
  t.setConstant(0.5f);
  EXPECT_THAT(error_of<ShapeError>([&] { m.denoiser.forward(ctx, long_latents, t, long_latents); }),
              AllOf(HasSubstr("denoiser"), HasSubstr("'x_t'"), HasSubstr("max_positions = 48")));
}

TEST(CommonInputs, WrongFeatureWidth) {
  const auto& m = small_model<float>();
  Context ctx;
  Tensor3<float> narrow(2, 5, 63);
  narrow.setZero();
  EXPECT_THAT(
      error_of<ShapeError>([&] { m.encoder.forward(ctx, narrow); }),
      AllOf(HasSubstr("encoder"), HasSubstr("'features'"), HasSubstr("expected shape [*, *, 64], got [2, 5, 63]")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.latent_decoder.forward(ctx, narrow); }),
              AllOf(HasSubstr("latent_decoder"), HasSubstr("'latents'"), HasSubstr("[2, 5, 63]")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.token_decoder.forward(ctx, narrow); }),
              AllOf(HasSubstr("token_decoder"), HasSubstr("'hidden'"), HasSubstr("[2, 5, 63]")));
}

TEST(CommonInputs, DenoiserChecksSelfCondAndTime) {
  const auto& m = small_model<float>();
  Context ctx;
  Tensor3<float> x_t(2, 5, 64), short_cond(2, 4, 64);
  x_t.setZero();
  short_cond.setZero();
  Tensor1<float> t(2);
  t.setValues({0.3f, 0.85f});
  EXPECT_THAT(
      error_of<ShapeError>([&] { m.denoiser.forward(ctx, x_t, t, short_cond); }),
      AllOf(HasSubstr("denoiser"), HasSubstr("'self_cond'"), HasSubstr("expected shape [2, 5, 64], got [2, 4, 64]")));

  Tensor1<float> three(3);
  three.setConstant(0.5f);
  EXPECT_THAT(error_of<ShapeError>([&] { m.denoiser.forward(ctx, x_t, three, x_t); }),
              AllOf(HasSubstr("denoiser"), HasSubstr("'t'"), HasSubstr("expected shape [2], got [3]")));

  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    t(1) = bad;
    EXPECT_THAT(error_of<InvalidArgument>([&] { m.denoiser.forward(ctx, x_t, t, x_t); }),
                AllOf(HasSubstr("denoiser"), HasSubstr("'t'"), HasSubstr("non-finite"), HasSubstr("index 1")));
  }
}

TEST(CommonInputs, OptionalFiniteCheckNamesTheOutput) {
  const auto& m = small_model<float>();
  Context ctx;
  ctx.check_finite = true;
  Tensor3<float> hidden(1, 3, 64);
  hidden.setZero();
  hidden(0, 1, 7) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(error_of<NumericError>([&] { m.token_decoder.forward(ctx, hidden); }),
              AllOf(HasSubstr("token_decoder"), HasSubstr("non-finite"), HasSubstr("'logits'")));
}

TEST(CommonInputs, UnloadedParametersAreAnErrorNotGarbage) {
  const Denoiser<float> fresh(small_config());
  Context ctx;
  Tensor3<float> x(1, 2, 64);
  x.setZero();
  Tensor1<float> t(1);
  t.setConstant(0.5f);
  EXPECT_THAT(error_of<Error>([&] { fresh.forward(ctx, x, t, x); }),
              HasSubstr("used before it was loaded or initialised"));
}

}  // namespace
}  // namespace unit_model_common
