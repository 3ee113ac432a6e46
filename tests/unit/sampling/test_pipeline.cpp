// The pipeline (sampling/pipeline.hpp): reconstruct, encode and decode against the
// model_small reference dumps.
#include <gtest/gtest.h>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"

namespace ldlm {
namespace unit_sampling_pipeline {
namespace {

using test::data_path;

bool same(const TokenTensor& a, const TokenTensor& b) {
  return shape_of(a) == shape_of(b) && std::equal(a.data(), a.data() + a.size(), b.data());
}

TEST(Pipeline, ReconstructMatchesModelSmallReference) {
  const Config c = Config::load(data_path("model_small/config.json"));
  LDLM<float> model(c);
  const auto weights = SafetensorsFile::open(data_path("model_small/weights.safetensors"));
  auto load = [&](auto& module, const std::string& prefix) {
    load_parameters(module, weights, prefix, LoadOptions::scoped(prefix));
  };
  load(model.feature_model, "feature_model.");
  load(model.encoder, "encoder.");
  load(model.latent_decoder, "latent_decoder.");
  load(model.token_decoder, "token_decoder.");
  const auto inputs = test::open_reference("model_small/reconstruct.inputs.safetensors");
  const auto outputs = test::open_reference("model_small/reconstruct.outputs.safetensors");
  const TokenTensor tokens = test::read_tensor<std::int64_t, 2>(inputs, "tokens");
  Context ctx(2);
  const Pipeline<float> pipeline(model);
  const Reconstruction<float> r = pipeline.reconstruct(ctx, tokens);
  // The four-module chain of ModelSmall.ReconstructChain (parity/test_modules.cpp), with its
  // tolerance: the largest error measured is 1.3e-6 (logits; hidden 1.2e-6), well inside
  // 2e-5 (AMD EPYC, Zen 5; g++ 12 -O3 -march=native, oneDNN, 2 threads; AVX-512 softmax rows).
  const test::Tolerance tol{2e-5, 2e-5};
  test::expect_matches(r.features, outputs, "features", tol);
  test::expect_matches(r.latents, outputs, "latents", tol);
  test::expect_matches(r.hidden, outputs, "hidden", tol);
  test::expect_matches(r.logits, outputs, "logits", tol);
  // tokens are the argmax of the logits; encode/decode agree with reconstruct.
  for (Index row = 0; row < tokens.size(); ++row) {
    const float* l = r.logits.data() + row * c.vocab_size;
    EXPECT_EQ(r.tokens.data()[row], std::max_element(l, l + c.vocab_size) - l) << "row " << row;
  }
  const Tensor3<float> latents = pipeline.encode(ctx, tokens);
  test::expect_matches(latents, outputs, "latents", tol, " (encode)");
  EXPECT_TRUE(same(pipeline.decode(ctx, latents).tokens, r.tokens));
}

}  // namespace
}  // namespace unit_sampling_pipeline
}  // namespace ldlm
