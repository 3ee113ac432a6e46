// ldlm::TextModel: text in, text out. A model, its tokenizer and what a call needs,
// behind a header that includes neither Eigen nor oneDNN, so that a program using it
// compiles in about a second. The implementation (text_model_impl.hpp, over the whole
// header-only library) is compiled once, into the CMake target ldlm::text.
//
//   #include <ldlm/text_model.hpp>
//   ldlm::TextModel lm = ldlm::TextModel::demo();
//   for (const std::string& text : lm.infill("The <|mask|> sat on the mat.")) ...
//   lm.continue_text("The old man", {.length = 24, .seed = 3});
//
// Threads: one TextModel may be shared by any number of threads. Every call is const and
// runs on an execution context of its own (thread pools are kept and reused); the
// weights are read-only once loaded; a precision other than the model's is loaded on
// its first use, once, under a lock. Callbacks run on the calling thread.
//
// docs/library.md is the guide; docs/model.md §Conditioning says how known text enters
// the sampler.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ldlm/core/error.hpp"

namespace ldlm {

/// One sample's token ids.
using TokenIds = std::vector<std::int64_t>;

/// A sampling run after one solver step, as a preview sees it. The spans are valid
/// during the callback only.
struct TextStep {
  int step = 0, steps = 0;                  // steps done, of steps
  int denoiser_calls = 0, total_calls = 0;  // the same in denoiser calls
  double t = 1;                             // the diffusion time of the step's latest denoiser call
  /// One per sample: what the step's current estimate x̂0 decodes to, the whole
  /// sequence, with every given token as given.
  std::span<const std::string> texts = {};
  std::span<const TokenIds> ids = {};
};

/// Where a call's time went. Filled when TextOptions::timings points here.
struct TextTimings {
  double encode_ms = 0;   // tokenizing, and the known tokens to latents
  double sample_ms = 0;   // the solver: every denoiser call (previews excluded)
  double preview_ms = 0;  // decoding the per-step previews (0 without on_step)
  double decode_ms = 0;   // the final latents to tokens, and tokens to text
  double total_ms = 0;    // the whole call
  int steps = 0, denoiser_calls = 0;
  std::int64_t tokens = 0;  // positions sampled, over all samples
};

/// Options of every call. Each has a default, so `{}` works, and so do designated
/// initializers in declaration order: {.length = 64, .seed = 3, .steps = 20}. (Every
/// member has an initializer, so GCC's -Wmissing-field-initializers stays quiet.) An
/// empty name or a 0 means the library's default, as `ldlm generate --help` shows it.
/// A field out of range throws InvalidArgument naming the field, the value and the
/// allowed range.
struct TextOptions {
  int length = 32;             // positions to generate (generate, continue_text), 1..max_positions
  int batch = 1;               // samples, 1..65536
  std::uint64_t seed = 0;      // noise seed; the same seed, options and threads give the same text
  std::string suffix = {};     // continue_text and generate: the text every sample ends with
  std::string sampler = {};    // the solver: "unipc-3m" (default), "dpmpp-3m", "heun", ...
  int steps = 0;               // solver steps, 0..1048576; 0: the default (10)
  std::string schedule = {};   // the time grid: "auto" (default: "fitted" when the model has a grid for
                               // the step count, else "lambda"), "fitted", "karras", "lambda", "uniform"
  std::string precision = {};  // "fp32", "bf16" or "int8"; "": the precision the model was opened with
  int threads = 0;             // 0..1024; 0: every core
  std::string method = {};     // how given text enters the sampler: "x0" (default), "x", "both"
  int resample = 0;            // RePaint resampling per step, 0..1000
  /// After every step: the text of the current estimate. It costs one decode of the
  /// batch per step (docs/performance.md gives the measured cost). Returning false cancels
  /// the call, which throws SamplingCancelled.
  std::function<bool(const TextStep&)> on_step = {};
  /// Asked after every step, without on_step's decode: returning true cancels the call,
  /// which throws SamplingCancelled. For a caller that stops work it no longer needs
  /// (a Python KeyboardInterrupt, an HTTP client gone).
  std::function<bool()> cancel = {};
  TextTimings* timings = nullptr;
};

/// One request of a batch (TextModel::sample_batch): `n` samples of `ids` (mask_id() at
/// every position to sample), with the noise of `seed`.
struct TextRequest {
  TokenIds ids = {};
  int n = 1;
  std::uint64_t seed = 0;
};

/// A request's samples, in the order of its seed's noise: the ids and their texts.
struct TextSamples {
  std::vector<TokenIds> ids = {};
  std::vector<std::string> texts = {};
};

/// How a model is opened.
struct TextModelOptions {
  /// The precision of the matrix products, fp32, bf16 or int8 (weights packed once, at
  /// load; int8 needs a CPU with VNNI or AMX-INT8); a call may ask for another, which is
  /// then loaded on first use.
  std::string precision = "fp32";
  /// The path of a JSON configuration file (docs/checkpoints.md), for a weights file
  /// without a configuration in its metadata; "" otherwise.
  std::string config = {};
};

/// Counts of the model's parameters (docs/model.md §Parameter accounting).
struct TextModelInfo {
  std::int64_t trained_parameters = 0, frozen_parameters = 0;
  int vocab_size = 0, max_positions = 0, d_model = 0;
  int mask_id = 0, pad_id = 0;
  double load_ms = 0;  // opening the file, the tokenizer, and packing the weights
};

class TextModel {
 public:
  /// The trained demo model that ships with ldlm (its model card: research/train/README.md),
  /// with GPT-2's tokenizer. Both are linked into ldlm::text: no file is read.
  static TextModel demo(const TextModelOptions& options = {});
  /// The model of a safetensors file (its configuration from the file's metadata, or
  /// options.config), and the tokenizer files of `tokenizer_dir` (encoder.json +
  /// vocab.bpe, vocab.json + merges.txt, or tokenizer.json); "" is GPT-2's. Throws
  /// IoError naming a missing file, FormatError for a file that is not an ldlm weights
  /// file (safetensors of another model included), ConfigError for options.config.
  static TextModel open(const std::string& weights, const std::string& tokenizer_dir = {},
                        const TextModelOptions& options = {});

  /// A moved-from TextModel may only be assigned to or destroyed.
  TextModel(TextModel&&) noexcept;
  TextModel& operator=(TextModel&&) noexcept;
  ~TextModel();

  /// `options.batch` texts of `options.length` tokens sampled from noise (ending with
  /// options.suffix, if given).
  std::vector<std::string> generate(const TextOptions& options = {}) const;
  /// `prompt`, then `options.length` sampled tokens (then options.suffix, if given).
  /// Each returned text is the whole sequence, prompt included.
  std::vector<std::string> continue_text(std::string_view prompt, const TextOptions& options = {}) const;
  /// `text` with each "<|mask|>" (one token position each) sampled, the rest kept.
  /// A space right before a marker belongs to the masked token. Throws InvalidArgument
  /// naming the text when it has no marker.
  std::vector<std::string> infill(std::string_view text, const TextOptions& options = {}) const;

  /// The same three on token ids, for callers that tokenize themselves. Each sample is
  /// the whole sequence; infill_ids takes ids with mask_id() at the positions to fill.
  std::vector<TokenIds> generate_ids(const TextOptions& options = {}) const;
  std::vector<TokenIds> continue_ids(std::span<const std::int64_t> prompt, const TextOptions& options = {}) const;
  std::vector<TokenIds> infill_ids(std::span<const std::int64_t> ids, const TextOptions& options = {}) const;

  /// Requests of one length T, sampled as one batch in one sampling loop with the
  /// sampler settings of `options` (its length, batch, seed and suffix are the
  /// requests' own and are not read). Each request's samples are those infill_ids(ids,
  /// {.batch = n, .seed = seed, ...}) gives alone: each request draws its own noise
  /// (SamplerOptions::noise_groups), and a sequence's denoiser result does not depend on
  /// the other rows of the batch. on_step's spans hold every row, request i's at
  /// [n_0 + ... + n_(i-1), ... + n_i); cancelling (on_step or cancel) cancels the whole
  /// batch. Throws InvalidArgument naming the request for an empty list, lengths that
  /// differ, ids without a mask id, or an n outside 1..65536 (or in total).
  std::vector<TextSamples> sample_batch(std::span<const TextRequest> requests, const TextOptions& options = {}) const;

  /// The model's tokenizer (GPT-2's byte-level BPE, with pad and mask after its tokens).
  TokenIds tokenize(std::string_view text) const;
  /// The ids that infill samples for `text`: each "<|mask|>" is one mask_id(), the text
  /// around the markers is tokenized piece by piece (a space right before a marker
  /// belongs to the masked token). Throws InvalidArgument for text that is not UTF-8.
  TokenIds tokenize_masked(std::string_view text) const;
  std::string detokenize(std::span<const std::int64_t> ids) const;

  TextModelInfo info() const;

 private:
  struct Impl;
  explicit TextModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ldlm
