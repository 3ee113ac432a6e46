// ldlm::TextModel (include/ldlm/text_model.hpp, compiled into ldlm::text): text in and
// out on the built-in demo model, the ids calls, the per-step preview, the timings,
// sharing one model between threads, and every bad input's message.
//
// The demo model is small (docs: tools/train/README.md), so each call here takes
// milliseconds. No tolerance is involved: TextModel must give the very ids that the
// layers give (Pipeline on the same file, same options, one thread), bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ldlm/text_model.hpp"
#include "support/errors.hpp"

namespace unit_text_model {
namespace {

using namespace ldlm;
using ldlm::test::error_of;
using ::testing::AllOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const TextModel& demo() {
  static const TextModel model = TextModel::demo();
  return model;
}

TEST(TextModel, GenerateGivesOneTextPerSampleAndDependsOnTheSeed) {
  const std::vector<std::string> a = demo().generate({.length = 12, .batch = 3, .seed = 5});
  ASSERT_EQ(a.size(), 3u);
  for (const std::string& text : a) EXPECT_FALSE(text.empty());
  EXPECT_EQ(demo().generate({.length = 12, .batch = 3, .seed = 5}), a) << "same seed, other text";
  EXPECT_NE(demo().generate({.length = 12, .batch = 3, .seed = 6}), a) << "the seed must matter";
}

TEST(TextModel, GivesTheIdsOfThePipelineBitForBit) {
  // TextModel runs every call as generation with known tokens; with none known, that is
  // unconditional sampling, whose ids the layers give directly.
  const Model model = load_model(LDLM_DEMO_MODEL);
  Context ctx(1);
  SamplerOptions options;
  options.seed = 11;
  const TokenTensor want = Pipeline(model).generate(ctx, 2, 10, options);
  const std::vector<TokenIds> got = demo().generate_ids({.length = 10, .batch = 2, .seed = 11, .threads = 1});
  ASSERT_EQ(got.size(), 2u);
  for (Index b = 0; b < 2; ++b)
    EXPECT_EQ(got[static_cast<std::size_t>(b)], TokenIds(want.data() + b * 10, want.data() + (b + 1) * 10))
        << "sample " << b;
}

TEST(TextModel, TextsAreTheDetokenizedIds) {
  const TextOptions options{.length = 8, .batch = 2, .seed = 3, .threads = 1};
  const std::vector<TokenIds> ids = demo().generate_ids(options);
  const std::vector<std::string> texts = demo().generate(options);
  ASSERT_EQ(ids.size(), texts.size());
  for (std::size_t b = 0; b < ids.size(); ++b) {
    EXPECT_EQ(ids[b].size(), 8u);
    EXPECT_EQ(demo().detokenize(ids[b]), texts[b]);
  }
}

TEST(TextModel, ContinueTextKeepsThePromptAndEndsOnTheSuffix) {
  const std::vector<std::string> texts =
      demo().continue_text("The old man", {.length = 6, .batch = 2, .suffix = " in the morning."});
  ASSERT_EQ(texts.size(), 2u);
  for (const std::string& text : texts)
    EXPECT_THAT(text, AllOf(StartsWith("The old man"), EndsWith(" in the morning.")));
  // Every argument but the prompt has a default.
  const std::vector<std::string> plain = demo().continue_text("The old man");
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_THAT(plain[0], StartsWith("The old man"));
  const std::vector<TokenIds> ids = demo().continue_ids(demo().tokenize("The old man"), {.length = 4});
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(ids[0].size(), demo().tokenize("The old man").size() + 4);
}

TEST(TextModel, InfillKeepsEveryGivenToken) {
  const std::vector<std::string> texts = demo().infill("The <|mask|> sat on the mat.");
  ASSERT_EQ(texts.size(), 1u);
  EXPECT_THAT(texts[0], AllOf(StartsWith("The"), EndsWith(" sat on the mat.")));
  TokenIds ids = demo().tokenize("The");
  const std::size_t known = ids.size();
  ids.push_back(demo().info().mask_id);
  ids.push_back(demo().info().mask_id);
  const std::vector<TokenIds> filled = demo().infill_ids(ids, {.batch = 2});
  ASSERT_EQ(filled.size(), 2u);
  for (const TokenIds& sample : filled) {
    ASSERT_EQ(sample.size(), ids.size());
    EXPECT_TRUE(std::equal(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(known), sample.begin()));
    EXPECT_NE(sample.back(), demo().info().mask_id);
  }
}

// sample_batch: requests of one length run as one batch, each with the ids it gets
// alone (infill_ids with its n and seed), on the threads of the machine; the preview sees
// every row in request order. Bit for bit: each row's products do not depend on the batch.
TEST(TextModel, SampleBatchGivesEachRequestItsSoloSamples) {
  const int mask = demo().info().mask_id;
  TokenIds a = demo().tokenize("The cat sat on the");
  a.push_back(mask);
  TokenIds b(a.size(), mask);
  b[0] = demo().tokenize("Once")[0];
  // Request 2 has request 0's ids and seed but n = 1: its noise differs after the first
  // draw (n·T·d normals a draw), so its sample is its own.
  const std::vector<TextRequest> requests{{a, 2, 3}, {b, 1, 9}, {a, 1, 3}};
  for (const std::string sampler : {"dpmpp-3m", "dpmpp-2m-sde"}) {
    int previews = 0;
    const std::vector<TextSamples> got = demo().sample_batch(
        requests, {.sampler = sampler, .steps = 5, .resample = 1, .on_step = [&](const TextStep& s) {
                     EXPECT_EQ(s.texts.size(), 4u);
                     ++previews;
                     return true;
                   }});
    EXPECT_EQ(previews, 5);
    ASSERT_EQ(got.size(), requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const std::vector<TokenIds> alone = demo().infill_ids(
          requests[i].ids,
          {.batch = requests[i].n, .seed = requests[i].seed, .sampler = sampler, .steps = 5, .resample = 1});
      EXPECT_EQ(got[i].ids, alone) << "request " << i << ", " << sampler;
      ASSERT_EQ(got[i].texts.size(), alone.size());
      for (std::size_t k = 0; k < alone.size(); ++k) EXPECT_EQ(got[i].texts[k], demo().detokenize(alone[k]));
    }
  }
  EXPECT_THAT(error_of<InvalidArgument>([&] { demo().sample_batch(std::vector<TextRequest>{}); }),
              HasSubstr("TextModel::sample_batch: no request to sample"));
  EXPECT_THAT(error_of<InvalidArgument>([&] {
                demo().sample_batch(std::vector<TextRequest>{{a, 1, 0}, {TokenIds(3, mask), 1, 0}});
              }),
              HasSubstr("requests[1] has 3 ids, requests[0] has"));
  EXPECT_THAT(error_of<InvalidArgument>([&] {
                demo().sample_batch(std::vector<TextRequest>{{a, 0, 0}});
              }),
              HasSubstr("requests[0].n must be in [1, 65536], got 0"));
  EXPECT_THAT(error_of<InvalidArgument>([&] {
                demo().sample_batch(std::vector<TextRequest>{{TokenIds{1, 2}, 1, 0}});
              }),
              HasSubstr("requests[0].ids has no <|mask|>"));
}

TEST(TextModel, PreviewSeesEveryStepAndCanCancel) {
  std::vector<int> steps;
  std::vector<double> times;
  const std::vector<std::string> texts =
      demo().infill("The <|mask|> sat on the <|mask|>.", {.batch = 2, .steps = 6, .on_step = [&](const TextStep& s) {
                                                            steps.push_back(s.step);
                                                            times.push_back(s.t);
                                                            EXPECT_EQ(s.steps, 6);
                                                            EXPECT_EQ(s.texts.size(), 2u);
                                                            EXPECT_EQ(s.ids.size(), 2u);
                                                            for (const std::string& text : s.texts)
                                                              EXPECT_THAT(text, StartsWith("The"));
                                                            return true;
                                                          }});
  EXPECT_EQ(steps, (std::vector<int>{1, 2, 3, 4, 5, 6}));
  for (std::size_t i = 1; i < times.size(); ++i) EXPECT_LT(times[i], times[i - 1]) << "step " << i + 1;
  // The preview only watches: the texts are those of a run without it.
  EXPECT_EQ(texts, demo().infill("The <|mask|> sat on the <|mask|>.", {.batch = 2, .steps = 6}));

  int calls = 0;
  EXPECT_THAT(error_of<SamplingCancelled>(
                  [&] { demo().generate({.length = 4, .on_step = [&](const TextStep&) { return ++calls < 3; }}); }),
              HasSubstr("after step 3"));
  EXPECT_EQ(calls, 3);
  // The cancelled call's context goes back to the pool and serves the next call as new.
  const TextOptions options{.length = 6, .seed = 9, .threads = 1};
  const std::vector<std::string> before = demo().generate(options);
  EXPECT_THROW(
      demo().generate({.length = 6, .seed = 9, .threads = 1, .on_step = [](const TextStep&) { return false; }}),
      SamplingCancelled);
  EXPECT_EQ(demo().generate(options), before);
}

TEST(TextModel, CancelStopsAtTheNextStepWithoutAPreview) {
  int asked = 0;
  TextTimings t;
  EXPECT_THAT(error_of<SamplingCancelled>([&] {
                demo().generate({.length = 4, .steps = 8, .cancel = [&] { return ++asked == 2; }, .timings = &t});
              }),
              HasSubstr("after step 2"));
  EXPECT_EQ(asked, 2);
  // Never cancelling changes nothing.
  const TextOptions options{.length = 5, .seed = 4};
  EXPECT_EQ(demo().generate({.length = 5, .seed = 4, .cancel = [] { return false; }}), demo().generate(options));
}

TEST(TextModel, TimingsCountTheCallsAndTheTokens) {
  TextTimings t;
  demo().continue_text("The old man", {.length = 5, .batch = 2, .sampler = "heun", .steps = 4, .timings = &t});
  EXPECT_EQ(t.steps, 4);
  EXPECT_EQ(t.denoiser_calls, 8);  // heun: two calls per step
  EXPECT_EQ(t.tokens, 10);
  EXPECT_GT(t.sample_ms, 0);
  EXPECT_GE(t.total_ms, t.encode_ms + t.sample_ms + t.decode_ms);
  EXPECT_EQ(t.preview_ms, 0);
}

TEST(TextModel, Bf16IsLoadedOnFirstUse) {
  const std::vector<TokenIds> fp32 = demo().generate_ids({.length = 16, .seed = 2});
  const std::vector<TokenIds> bf16 = demo().generate_ids({.length = 16, .seed = 2, .precision = "bf16"});
  ASSERT_EQ(bf16.size(), 1u);
  ASSERT_EQ(bf16[0].size(), 16u);
  // Not bit-equal: bf16 products round differently. Most ids agree on the demo model.
  int same = 0;
  for (std::size_t i = 0; i < 16; ++i) same += fp32[0][i] == bf16[0][i];
  EXPECT_GE(same, 8) << "bf16 and fp32 agree on only " << same << " of 16 ids";
}

TEST(TextModel, ConcurrentCallsOnOneModelMatchSerialOnes) {
  const std::vector<TextOptions> requests = {{.length = 12, .batch = 2, .seed = 1, .threads = 1},
                                             {.length = 9, .seed = 2, .sampler = "unipc", .threads = 1},
                                             {.length = 7, .batch = 3, .seed = 3, .threads = 2},
                                             {.length = 12, .batch = 2, .seed = 1, .threads = 1}};
  std::vector<std::vector<std::string>> serial;
  for (const TextOptions& r : requests) serial.push_back(demo().generate(r));
  std::vector<std::vector<std::string>> parallel(requests.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < requests.size(); ++i)
    threads.emplace_back([&, i] { parallel[i] = demo().generate(requests[i]); });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(parallel, serial);
}

TEST(TextModel, InfoCountsTheParameters) {
  const TextModelInfo info = demo().info();
  EXPECT_EQ(info.vocab_size, 50259);
  EXPECT_EQ(info.mask_id, 50258);
  EXPECT_EQ(info.pad_id, 50257);
  EXPECT_GT(info.trained_parameters, 0);
  EXPECT_GT(info.load_ms, 0);
  EXPECT_EQ(demo().tokenize("Hello world"), (TokenIds{15496, 995}));
}

TEST(TextModel, OpenReadsAModelFileAndATokenizerDirectory) {
  const TextModel lm = TextModel::open(LDLM_DEMO_MODEL, LDLM_GPT2_TOKENIZER_DIR);
  EXPECT_EQ(lm.generate({.length = 8, .seed = 4, .threads = 1}),
            demo().generate({.length = 8, .seed = 4, .threads = 1}));
}

TEST(TextModel, OpenNamesAMissingOrForeignFile) {
  EXPECT_THAT(error_of<IoError>([] { TextModel::open("/nonexistent/ldlm.safetensors"); }),
              AllOf(HasSubstr("TextModel::open: cannot read the weights"), HasSubstr("/nonexistent/ldlm.safetensors")));
  // A file that is not safetensors: GPT-2's vocabulary.
  const std::string foreign = std::string(LDLM_GPT2_TOKENIZER_DIR) + "/encoder.json";
  EXPECT_THAT(error_of<FormatError>([&] { TextModel::open(foreign); }),
              AllOf(HasSubstr(foreign), HasSubstr("is not an ldlm weights file")));
  // Safetensors of something else: a primitive's reference dump.
  const std::string other = std::string(LDLM_TEST_DATA_DIR) + "/primitives/swiglu.safetensors";
  EXPECT_THAT(error_of<FormatError>([&] { TextModel::open(other); }),
              AllOf(HasSubstr(other), HasSubstr("is not an ldlm weights file"), HasSubstr("no denoiser.* tensor")));
  EXPECT_THAT(error_of<ConfigError>([] { TextModel::open(LDLM_DEMO_MODEL, "", {.config = "/nonexistent/c.json"}); }),
              AllOf(HasSubstr("TextModel::open"), HasSubstr("/nonexistent/c.json")));
  EXPECT_THAT(error_of<IoError>([] { TextModel::open(LDLM_DEMO_MODEL, "/nonexistent/tokenizer"); }),
              HasSubstr("/nonexistent/tokenizer"));
  EXPECT_THAT(error_of<InvalidArgument>([] { TextModel::open(LDLM_DEMO_MODEL, "", {.precision = "fp16"}); }),
              AllOf(HasSubstr("precision"), HasSubstr("fp16"), HasSubstr("fp32, bf16")));
}

TEST(TextModel, InfillWithoutAMarkerNamesTheText) {
  EXPECT_THAT(error_of<InvalidArgument>([] { demo().infill("The cat sat."); }),
              AllOf(HasSubstr("TextModel::infill"), HasSubstr("\"The cat sat.\""), HasSubstr("<|mask|>")));
  EXPECT_THAT(error_of<InvalidArgument>([] {
                demo().infill_ids(TokenIds{464, 3797});
              }),
              AllOf(HasSubstr("infill_ids"), HasSubstr("mask id 50258")));
  EXPECT_THAT(error_of<InvalidArgument>([] {
                demo().infill_ids(TokenIds{464, 50258, 70000});
              }),
              AllOf(HasSubstr("70000"), HasSubstr("[0, 50259)")));
}

TEST(TextModel, FieldsOutOfRangeNameTheFieldTheValueAndTheRange) {
  struct Case {
    TextOptions options;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {{.length = 0}, {"length", "[1, ", "got 0"}},
      {{.length = 100000}, {"length", "got 100000"}},
      {{.batch = 0}, {"batch", "[1, 65536]", "got 0"}},
      {{.batch = 65537}, {"batch", "got 65537"}},
      {{.steps = 1048577}, {"steps", "got 1048577"}},
      {{.threads = -1}, {"threads", "got -1"}},
      {{.resample = 1001}, {"resample", "got 1001"}},
      {{.steps = -1}, {"steps", "[0, 1048576]", "got -1"}},
      {{.threads = 2000}, {"threads", "[0, 1024]", "got 2000"}},
      {{.resample = -2}, {"resample", "[0, 1000]", "got -2"}},
      {{.sampler = "euler"}, {"sampler 'euler'", "dpmpp-3m"}},
      {{.schedule = "cosine"}, {"schedule 'cosine'", "karras"}},
      {{.precision = "int4"}, {"precision 'int4'", "fp32, bf16"}},
      {{.method = "blend"}, {"method 'blend'", "x0"}},
  };
  for (const Case& c : cases) {
    const std::string message = error_of<InvalidArgument>([&] { demo().generate(c.options); });
    EXPECT_THAT(message, HasSubstr("TextModel::generate"));
    for (const std::string& word : c.words) EXPECT_THAT(message, HasSubstr(word));
  }
  // Each call names itself.
  EXPECT_THAT(error_of<InvalidArgument>([] { demo().generate_ids({.batch = 0}); }),
              HasSubstr("TextModel::generate_ids"));
  EXPECT_THAT(error_of<InvalidArgument>([] { demo().continue_ids(TokenIds{464}, {.length = 0}); }),
              HasSubstr("TextModel::continue_ids: length must be in [1, "));
  EXPECT_THAT(error_of<InvalidArgument>([] { demo().continue_text("The", {.steps = -1}); }),
              HasSubstr("TextModel::continue_text: steps"));
  EXPECT_THAT(error_of<InvalidArgument>([] {
                std::string prompt;
                for (int i = 0; i < 3000; ++i) prompt += " the";
                demo().continue_text(prompt, {.length = 8});
              }),
              HasSubstr("max_positions"));
}

}  // namespace
}  // namespace unit_text_model
