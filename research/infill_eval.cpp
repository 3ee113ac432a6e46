// Infill and prompt continuation with known tokens (docs/model.md §Conditioning) on held-out
// sentences: every condition method × known-latent fill × from_t, RePaint resampling and
// several samplers, against the autoencoder alone and unconditional generation.
//
//   ldlm_infill_eval --sentences S.tsv --output R.json [--weights W.safetensors] [--per-source N]
//                    [--seeds K] [--grid-seeds G] [--around METHOD,FILL,FROM_T] [--samplers a,b] [--resample R]
//                    [--prompt-tokens P] [--prompt-length T] [--timing-rounds N] [--threads N]
//
// S.tsv (research/infill.py sentences writes it): "source <TAB> key <TAB> text" per line, each
// source's candidates in a fixed order. The tool tokenizes them with ldlm's GPT-2 tokenizer and
// keeps the first N of each source that fit: 9 to 64 tokens, a word to mask after the first
// token, and spans of 3 and 8 tokens that start and end on word boundaries after the first
// token. In each kept sentence it masks, one task at a time, a word (all of its tokens, its
// leading space included), a span of 3 and a span of 8 tokens, each chosen by a hash
// (splitmix64) of the sentence's index among the kept ones. Sentences of equal length share a batch,
// at most kMaxBatch of them; a seed's noise is the batch's.
//
// The runs, with seeds 0..K-1 unless said (the autoencoder is deterministic):
//   autoencoder    the masked ids encoded and decoded (Pipeline::encode, decode_tokens)
//   unconditional  every position masked (unconditional sampling), read at the masked positions,
//                  with the default sampler and the --samplers (default dpmpp-2m,unipc; the default
//                  sampler itself is not run twice)
//   conditioned    method × fill × from_t {1, 0.8} with seeds 0..G-1 (--grid-seeds), but the
//                  --around method/fill/from_t with K; around it, --resample R and the
//                  --samplers at their default steps
//   known_alone    for each fill, the known latents decoded by themselves (mask and pad: the
//                  filled sequence; separate: each run of known positions alone)
//   prompt         the first P tokens of each sentence as a prompt of a T-token sequence, for
//                  every method at the --around fill and from_t, against unconditional
//                  generation at T
//   timing         seconds per sampling step without a condition and with each method, the
//                  runs alternating; the condition's hooks alone per step; the encoding of the
//                  known latents per fill
// Each row gives its fills' texts (research/infill.py scores them with the dictionary), exact
// recovery per sentence, and how many known positions the decoded latents reproduce before the
// known ids are restored (consistency).
#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ldlm/io/state_dict.hpp"
#include "ldlm/io/tokenizer.hpp"
#include "ldlm/ldlm.hpp"

#include "eval_args.hpp"

namespace {

using namespace ldlm;
using bench::arg;
using bench::split;

constexpr Index kMinTokens = 9, kMaxTokens = 64, kMaxBatch = 64;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Span {
  Index start = 0, length = 0;
};

const std::vector<std::string> kTasks = {"word", "span3", "span8"};

struct Sentence {
  std::string source, key, text;
  std::vector<std::int64_t> ids;
  std::map<std::string, Span> masks;  // by task
};

// GPT-2 tokens carry a word's leading space: a word begins at " x..." and goes on through
// the tokens that begin with a letter.
bool begins_word(std::string_view token) {
  return token.size() >= 2 && token[0] == ' ' && std::isalpha(static_cast<unsigned char>(token[1]));
}
bool continues_word(std::string_view token) {
  return !token.empty() && std::isalpha(static_cast<unsigned char>(token[0]));
}
bool all_letters(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
}

// One of `count` choices, by a hash of the sentence's index and the task.
std::size_t pick(std::uint64_t index, std::uint64_t task, std::size_t count) {
  return static_cast<std::size_t>(detail::splitmix64(index * detail::kGolden + task) % count);
}

// The masks of one sentence; false when it has no word or span to mask.
bool choose_masks(const Tokenizer& tokenizer, Sentence& s, std::uint64_t index) {
  const Index n = static_cast<Index>(s.ids.size());
  auto token = [&](Index i) { return tokenizer.token(s.ids[i]); };
  std::vector<Span> words;
  for (Index i = 1; i < n; ++i) {
    if (!begins_word(token(i))) continue;
    Index j = i + 1;
    bool letters = all_letters(token(i).substr(1));
    for (; j < n && continues_word(token(j)); ++j) letters = letters && all_letters(token(j));
    if (letters) words.push_back({i, j - i});
  }
  if (words.empty()) return false;
  s.masks["word"] = words[pick(index, 1, words.size())];
  for (const Index length : {Index{3}, Index{8}}) {
    std::vector<Span> spans;
    for (Index i = 1; i + length <= n; ++i)
      if (begins_word(token(i)) && (i + length == n || !continues_word(token(i + length))))
        spans.push_back({i, length});
    if (spans.empty()) return false;
    s.masks["span" + std::to_string(length)] = spans[pick(index, static_cast<std::uint64_t>(length), spans.size())];
  }
  return true;
}

// Batches of sentence indices of one length each.
std::vector<std::vector<std::size_t>> batches_by_length(const std::vector<Sentence>& sentences) {
  std::map<std::size_t, std::vector<std::size_t>> by_length;
  for (std::size_t i = 0; i < sentences.size(); ++i) by_length[sentences[i].ids.size()].push_back(i);
  std::vector<std::vector<std::size_t>> out;
  for (const auto& [length, members] : by_length)
    for (std::size_t k = 0; k < members.size(); k += kMaxBatch)
      out.emplace_back(members.begin() + k, members.begin() + std::min(members.size(), k + kMaxBatch));
  return out;
}

struct Condition {
  ConditionOptions options;
  SamplerOptions sampler;
};

nlohmann::json describe(const Condition& c) {
  return {{"method", condition_method_info(c.options.method).name},
          {"fill", known_fill_info(c.options.fill).name},
          {"from_t", c.options.from_t},
          {"resample", c.options.resample},
          {"sampler", sampler_info(c.sampler.kind).name},
          {"steps", c.sampler.steps}};
}

// What a run gives at each sentence's free positions, and how its known positions decode.
struct Outcome {
  std::vector<std::string> fills;
  std::vector<std::vector<std::int64_t>> fill_ids;
  std::vector<int> exact;
  long known_agree = 0, known_total = 0;
  int consistent_sentences = 0;
  int calls = 0;
  double seconds = 0;

  nlohmann::json json() const {
    nlohmann::json j = {
        {"fills", fills}, {"fill_ids", fill_ids}, {"exact", exact}, {"calls", calls}, {"seconds", seconds}};
    if (known_total > 0) {
      j["known_agree"] = known_agree;
      j["known_total"] = known_total;
      j["consistent_sentences"] = consistent_sentences;
    }
    return j;
  }
};

struct Evaluator {
  const LDLM<float>& model;
  const Pipeline<float> pipe;
  const Tokenizer& tokenizer;
  Context& ctx;
  const std::vector<Sentence>& sentences;
  const std::vector<std::vector<std::size_t>> batches;
  const std::int64_t mask;

  Evaluator(const LDLM<float>& m, const Tokenizer& tok, Context& c, const std::vector<Sentence>& s)
      : model(m),
        pipe(m),
        tokenizer(tok),
        ctx(c),
        sentences(s),
        batches(batches_by_length(s)),
        mask(mask_id(m.config)) {}

  TokenTensor masked_ids(const std::vector<std::size_t>& batch, const std::string& task) const {
    const Index T = static_cast<Index>(sentences[batch[0]].ids.size());
    TokenTensor ids(static_cast<Index>(batch.size()), T);
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const Sentence& s = sentences[batch[b]];
      for (Index t = 0; t < T; ++t) ids(static_cast<Index>(b), t) = s.ids[t];
      const Span m = s.masks.at(task);
      for (Index t = m.start; t < m.start + m.length; ++t) ids(static_cast<Index>(b), t) = mask;
    }
    return ids;
  }

  // Scores the decoded ids of one batch for `task`: the fill and its exact recovery, and
  // (with `known`) the agreement at the positions outside the mask.
  void score(const std::vector<std::size_t>& batch, const std::string& task, const TokenTensor& decoded, bool known,
             Outcome& out) const {
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const Sentence& s = sentences[batch[b]];
      const Span m = s.masks.at(task);
      std::vector<std::int64_t> fill(static_cast<std::size_t>(m.length));
      for (Index t = 0; t < m.length; ++t) fill[t] = decoded(static_cast<Index>(b), m.start + t);
      out.fills[batch[b]] = tokenizer.decode(fill);
      out.exact[batch[b]] = std::equal(fill.begin(), fill.end(), s.ids.begin() + m.start);
      out.fill_ids[batch[b]] = std::move(fill);
      if (!known) continue;
      bool all = true;
      for (Index t = 0; t < static_cast<Index>(s.ids.size()); ++t) {
        if (t >= m.start && t < m.start + m.length) continue;
        const bool same = decoded(static_cast<Index>(b), t) == s.ids[t];
        out.known_agree += same;
        ++out.known_total;
        all = all && same;
      }
      out.consistent_sentences += all;
    }
  }

  Outcome fresh() const {
    Outcome o;
    o.fills.resize(sentences.size());
    o.fill_ids.resize(sentences.size());
    o.exact.resize(sentences.size());
    return o;
  }

  Outcome autoencoder(const std::string& task) const {
    Outcome out = fresh();
    const auto start = std::chrono::steady_clock::now();
    for (const auto& batch : batches) {
      const TokenTensor ids = masked_ids(batch, task);
      score(batch, task, pipe.decode_tokens(ctx, pipe.encode(ctx, ids)), true, out);
    }
    out.seconds = seconds_since(start);
    return out;
  }

  // Unconditional samples do not depend on the task: one run, scored for every task.
  std::map<std::string, Outcome> unconditional(const SamplerOptions& options) const {
    std::map<std::string, Outcome> out;
    for (const auto& task : kTasks) out[task] = fresh();
    const auto start = std::chrono::steady_clock::now();
    int calls = 0;
    for (const auto& batch : batches) {
      const Index B = static_cast<Index>(batch.size()), T = static_cast<Index>(sentences[batch[0]].ids.size());
      SamplingStats stats;
      const TokenTensor decoded = pipe.decode_tokens(ctx, pipe.sample(ctx, B, T, options, &stats));
      calls = stats.denoiser_calls;
      for (const auto& task : kTasks) score(batch, task, decoded, false, out[task]);
    }
    for (auto& [task, o] : out) {
      o.seconds = seconds_since(start);
      o.calls = calls;
    }
    return out;
  }

  Outcome conditioned(const std::string& task, const Condition& c) const {
    Outcome out = fresh();
    const auto start = std::chrono::steady_clock::now();
    for (const auto& batch : batches) {
      SamplingStats stats;
      const TokenTensor ids = masked_ids(batch, task);
      score(batch, task, pipe.decode_tokens(ctx, pipe.sample(ctx, ids, c.sampler, c.options, &stats)), true, out);
      out.calls = stats.denoiser_calls;
    }
    out.seconds = seconds_since(start);
    return out;
  }

  // The known latents decoded by themselves: for mask and pad the filled sequence, for
  // separate each run of known positions as a sequence of its own.
  Outcome known_alone(const std::string& task, KnownFill fill) const {
    Outcome out = fresh();
    const Index d = model.config.d_model;
    for (const auto& batch : batches) {
      const TokenTensor ids = masked_ids(batch, task);
      const KnownRows<float> known = pipe.known_latents(ctx, ids, fill);
      const Index B = ids.dimension(0), T = ids.dimension(1);
      TokenTensor decoded(B, T);
      std::fill(decoded.data(), decoded.data() + decoded.size(), mask);
      if (fill == KnownFill::separate) {
        // known.rows ascend; a run ends where the next row is not the next position of
        // the same sequence.
        for (std::size_t k = 0; k < known.rows.size();) {
          std::size_t end = k + 1;
          while (end < known.rows.size() && known.rows[end] == known.rows[end - 1] + 1 &&
                 known.rows[end] / T == known.rows[k] / T)
            ++end;
          Tensor3<float> z(1, static_cast<Index>(end - k), d);
          as_matrix(z) = known.z.middleRows(static_cast<Index>(k), static_cast<Index>(end - k));
          const TokenTensor run = pipe.decode_tokens(ctx, z);
          for (std::size_t r = k; r < end; ++r) decoded.data()[known.rows[r]] = run(0, static_cast<Index>(r - k));
          k = end;
        }
      } else {
        TokenTensor filled = ids;
        const std::int64_t stand_in = fill == KnownFill::pad ? pad_id(model.config) : mask;
        for (Index r = 0; r < filled.size(); ++r)
          if (filled.data()[r] == mask) filled.data()[r] = stand_in;
        decoded = pipe.decode_tokens(ctx, pipe.encode(ctx, filled));
      }
      score(batch, task, decoded, true, out);
    }
    return out;
  }

  // Continuations of each sentence's first `prompt` tokens to `length` tokens; without a
  // condition, unconditional samples of `length` tokens read at the same positions.
  Outcome prompt(Index prompt, Index length, const std::optional<Condition>& c, const SamplerOptions& options) const {
    Outcome out = fresh();
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t k = 0; k < sentences.size(); k += kMaxBatch) {
      const Index B = static_cast<Index>(std::min<std::size_t>(kMaxBatch, sentences.size() - k));
      TokenTensor ids(B, length);
      std::fill(ids.data(), ids.data() + ids.size(), mask);
      for (Index b = 0; b < B; ++b)
        for (Index t = 0; t < prompt; ++t) ids(b, t) = sentences[k + b].ids[t];
      SamplingStats stats;
      const TokenTensor decoded = c ? pipe.decode_tokens(ctx, pipe.sample(ctx, ids, c->sampler, c->options, &stats))
                                    : pipe.decode_tokens(ctx, pipe.sample(ctx, B, length, options, &stats));
      out.calls = stats.denoiser_calls;
      for (Index b = 0; b < B; ++b) {
        std::vector<std::int64_t> continuation;
        for (Index t = prompt; t < length; ++t) continuation.push_back(decoded(b, t));
        out.fills[k + b] = tokenizer.decode(continuation);
        out.fill_ids[k + b] = std::move(continuation);
        if (!c) continue;
        bool all = true;
        for (Index t = 0; t < prompt; ++t) {
          const bool same = decoded(b, t) == ids(b, t);
          out.known_agree += same;
          ++out.known_total;
          all = all && same;
        }
        out.consistent_sentences += all;
      }
    }
    out.seconds = seconds_since(start);
    return out;
  }
};

// The 1-minute load average (getloadavg; -1 where it is unavailable).
double load_average() {
  double load[1] = {-1};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Seconds per sampling step without a condition and with each method (the runs alternate,
// so that the machine's load falls on all of them alike), and the encoding of the known
// latents per fill: B sequences of T tokens, the first half of each known.
nlohmann::json timing(const Evaluator& eval, Index B, Index T, int rounds) {
  const LDLM<float>& model = eval.model;
  TokenTensor ids(B, T);
  for (Index b = 0; b < B; ++b) {
    const auto& s = eval.sentences[static_cast<std::size_t>(b) % eval.sentences.size()].ids;
    for (Index t = 0; t < T; ++t) ids(b, t) = t < T / 2 ? s[static_cast<std::size_t>(t) % s.size()] : eval.mask;
  }
  SamplerOptions options;
  const KnownRows<float> known = eval.pipe.known_latents(eval.ctx, ids, KnownFill::mask);
  std::vector<std::string> names = {"none"};
  for (const auto& info : kConditionMethods) names.emplace_back(info.name);
  std::map<std::string, std::vector<double>> step_seconds;
  std::map<std::string, std::vector<double>> encode_seconds;
  for (int r = 0; r < rounds; ++r) {
    for (const auto& name : names) {
      ConditionOptions condition;
      if (name != "none") condition.method = find_condition_method(name).value();
      SamplingStats stats;
      const auto start = std::chrono::steady_clock::now();
      detail::sample_latent_tensor("timing", eval.ctx, model.denoiser, B, T, options, &stats, {},
                                   name == "none" ? nullptr : &known, condition);
      step_seconds[name].push_back(seconds_since(start) / stats.steps);
    }
    for (const auto& info : kKnownFills) {
      const auto start = std::chrono::steady_clock::now();
      (void)eval.pipe.known_latents(eval.ctx, ids, info.value);
      encode_seconds[std::string(info.name)].push_back(seconds_since(start));
    }
  }
  nlohmann::json out = {{"batch", B},
                        {"length", T},
                        {"known_per_sequence", T / 2},
                        {"rounds", rounds},
                        {"steps", options.steps},
                        {"sampler", sampler_info(options.kind).name}};
  for (const auto& name : names) {
    out["step_seconds"][name] = median(step_seconds[name]);
    out["step_seconds_all"][name] = step_seconds[name];
  }
  for (const auto& [name, v] : encode_seconds) out["encode_seconds"][name] = median(v);
  // The hooks alone, on the same rows: what a condition adds to a step, free of the noise
  // of whole runs on a shared machine. A step runs on_denoised once per call and on_step once.
  const Index n = B * T * model.config.d_model;
  std::vector<float> start(static_cast<std::size_t>(n)), x(start.size()), x0(start.size());
  NormalGenerator rng(0);
  rng.fill(start.data(), n);
  const TangentSchedule schedule = TangentSchedule::from_config(model.config);
  constexpr int kHookRepeats = 2000;
  for (const auto& info : kConditionMethods) {
    ConditionOptions condition;
    condition.method = info.value;
    const SolverHooks<float> hooks = condition_hooks(known, start.data(), model.config.d_model, schedule, condition);
    std::vector<double> per_step;
    for (int r = 0; r < rounds; ++r) {
      const auto begin = std::chrono::steady_clock::now();
      for (int i = 0; i < kHookRepeats; ++i) {
        const double t = 0.5 + 0.4 * (i % 2);
        if (hooks.on_denoised) hooks.on_denoised(t, x0.data());
        if (hooks.on_step) hooks.on_step(t, false, x.data());
      }
      per_step.push_back(seconds_since(begin) / kHookRepeats);
    }
    out["hook_seconds_per_step"][std::string(info.name)] = median(per_step);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const std::string sentences_path = arg(args, "sentences", "");
  const std::string output = arg(args, "output", "");
  if (sentences_path.empty() || output.empty()) {
    std::fprintf(stderr,
                 "usage: ldlm_infill_eval --sentences S.tsv --output R.json [--weights W.safetensors]\n"
                 "       [--per-source N] [--seeds K] [--grid-seeds G] [--around METHOD,FILL,FROM_T] [--samplers a,b]\n"
                 "       [--resample R] [--prompt-tokens P] [--prompt-length T] [--timing-rounds N]\n"
                 "       [--threads N] [--tokenizer DIR]\n");
    return 2;
  }
  const std::string weights_path = arg(args, "weights", LDLM_DEMO_MODEL);
  const std::size_t per_source = std::stoul(arg(args, "per-source", "50"));
  const int seeds = std::stoi(arg(args, "seeds", "2"));
  const int grid_seeds = std::min(seeds, std::stoi(arg(args, "grid-seeds", "1")));
  const int resample = std::stoi(arg(args, "resample", "2"));
  const Index prompt_tokens = std::stoll(arg(args, "prompt-tokens", "8"));
  const Index prompt_length = std::stoll(arg(args, "prompt-length", "48"));
  const int timing_rounds = std::stoi(arg(args, "timing-rounds", "15"));
  const std::vector<std::string> around = split(arg(args, "around", "x0,mask,1"));
  if (around.size() != 3) throw InvalidArgument("--around takes METHOD,FILL,FROM_T");
  Condition best;
  best.options.method = find_condition_method(around[0]).value();
  best.options.fill = find_known_fill(around[1]).value();
  best.options.from_t = std::stod(around[2]);
  std::vector<SamplerKind> samplers;
  for (const auto& name : split(arg(args, "samplers", "dpmpp-2m,unipc")))
    if (const SamplerKind kind = find_sampler(name).value(); kind != kDefaultSampler) samplers.push_back(kind);

  std::optional<SafetensorsFile> file = SafetensorsFile::open(weights_path);
  LDLM<float> model(resolve_config(*file, std::nullopt));
  for (const auto& name : module_names()) load_or_init_module(model, file, name);
  const Tokenizer tokenizer = Tokenizer::load(arg(args, "tokenizer", LDLM_GPT2_TOKENIZER_DIR));
  Context ctx(std::stoi(arg(args, "threads", "1")));

  // The first per_source sentences of each source that fit.
  std::vector<Sentence> sentences;
  std::map<std::string, std::size_t> kept;
  std::map<std::string, std::map<std::string, int>> skipped;
  {
    std::ifstream in(sentences_path);
    if (!in) throw IoError("ldlm_infill_eval: cannot read '" + sentences_path + "'");
    for (std::string line; std::getline(in, line);) {
      const std::vector<std::string> fields = split(line, '\t');
      if (fields.size() != 3) throw InvalidArgument("ldlm_infill_eval: expected source<TAB>key<TAB>text: " + line);
      Sentence s{fields[0], fields[1], fields[2], tokenizer.encode(fields[2]), {}};
      if (kept[s.source] >= per_source) continue;
      const Index n = static_cast<Index>(s.ids.size());
      if (n < kMinTokens || n > kMaxTokens) {
        ++skipped[s.source]["length"];
        continue;
      }
      if (!choose_masks(tokenizer, s, sentences.size())) {
        ++skipped[s.source]["no word or span"];
        continue;
      }
      ++kept[s.source];
      sentences.push_back(std::move(s));
    }
  }
  const Evaluator eval(model, tokenizer, ctx, sentences);

  nlohmann::json out;
  const std::string model_name = weights_path.substr(weights_path.find_last_of('/') + 1);
  out["meta"] = {{"model", model_name},
                 {"seeds", seeds},
                 {"grid_seeds", grid_seeds},
                 {"per_source", per_source},
                 {"batches", eval.batches.size()},
                 {"prompt_tokens", prompt_tokens},
                 {"prompt_length", prompt_length},
                 {"around", describe(best)},
                 {"cpu", cpu_features().brand},
                 {"cpu_family", cpu_features().family},
                 {"cpu_model", cpu_features().model},
                 {"threads", ctx.threads()},
                 {"kept", kept},
                 {"skipped", skipped}};
  for (const Sentence& s : sentences) {
    nlohmann::json j = {{"source", s.source}, {"key", s.key}, {"text", s.text}, {"tokens", s.ids.size()}};
    for (const auto& [task, m] : s.masks) {
      const auto begin = s.ids.begin() + m.start, end = begin + m.length;
      j["masks"][task] = {{"start", m.start},
                          {"length", m.length},
                          {"text", tokenizer.decode(std::vector<std::int64_t>(begin, end))},
                          {"before", tokenizer.decode(std::vector<std::int64_t>(s.ids.begin(), begin))},
                          {"after", tokenizer.decode(std::vector<std::int64_t>(end, s.ids.end()))}};
    }
    const std::vector<std::int64_t> head(s.ids.begin(), s.ids.begin() + prompt_tokens);
    j["prompt"] = tokenizer.decode(head);
    out["sentences"].push_back(j);
  }
  std::fprintf(stderr, "%zu sentences in %zu batches\n", sentences.size(), eval.batches.size());

  const auto total_start = std::chrono::steady_clock::now();
  out["meta"]["load_average_start"] = load_average();
  auto add = [&](nlohmann::json row, const Outcome& o) {
    int exact = 0;
    for (const int e : o.exact) exact += e;
    std::string what;
    for (const auto& [key, value] : row.items())
      what += " " + key + "=" + (value.is_string() ? value.get<std::string>() : value.dump());
    std::fprintf(stderr, "[%6.0f s]%s: exact %d/%zu, known %.4f, %d calls, %.1f s\n", seconds_since(total_start),
                 what.c_str(), exact, o.exact.size(),
                 o.known_total ? double(o.known_agree) / double(o.known_total) : 0.0, o.calls, o.seconds);
    row.update(o.json());
    out["runs"].push_back(std::move(row));
  };

  for (const auto& task : kTasks) add({{"kind", "autoencoder"}, {"task", task}}, eval.autoencoder(task));
  for (const auto& info : kKnownFills)
    for (const auto& task : kTasks)
      add({{"kind", "known_alone"}, {"task", task}, {"fill", info.name}}, eval.known_alone(task, info.value));

  // Each condition with the number of seeds it runs with: the grid of methods × fills ×
  // from_t with --grid-seeds, the rows around the chosen one with --seeds.
  std::vector<std::pair<Condition, int>> conditions;
  for (const double from_t : {1.0, 0.8})
    for (const auto& m : kConditionMethods)
      for (const auto& f : kKnownFills) {
        Condition c;
        c.options.method = m.value;
        c.options.fill = f.value;
        c.options.from_t = from_t;
        const bool is_best = c.options.method == best.options.method && c.options.fill == best.options.fill &&
                             from_t == best.options.from_t;
        conditions.emplace_back(c, is_best ? seeds : grid_seeds);
      }
  Condition resampled = best;
  resampled.options.resample = resample;
  conditions.emplace_back(resampled, seeds);
  for (const SamplerKind kind : samplers) {
    Condition c = best;
    c.sampler.kind = kind;
    conditions.emplace_back(c, seeds);
  }

  for (int seed = 0; seed < seeds; ++seed) {
    SamplerOptions options;
    options.seed = static_cast<std::uint64_t>(seed);
    for (const auto& [task, o] : eval.unconditional(options))
      add({{"kind", "unconditional"}, {"task", task}, {"seed", seed}}, o);
    for (const SamplerKind kind : samplers) {
      SamplerOptions other = options;
      other.kind = kind;
      for (const auto& [task, o] : eval.unconditional(other))
        add({{"kind", "unconditional"}, {"task", task}, {"seed", seed}, {"sampler", sampler_info(kind).name}}, o);
    }
    for (auto [c, condition_seeds] : conditions) {
      if (seed >= condition_seeds) continue;
      c.sampler.seed = options.seed;
      for (const auto& task : kTasks) {
        nlohmann::json row = describe(c);
        row["kind"] = "conditioned";
        row["task"] = task;
        row["seed"] = seed;
        add(row, eval.conditioned(task, c));
      }
    }
    add({{"kind", "prompt"}, {"seed", seed}}, eval.prompt(prompt_tokens, prompt_length, std::nullopt, options));
    for (const auto& m : kConditionMethods) {
      Condition c = best;
      c.options.method = m.value;
      c.sampler.seed = options.seed;
      nlohmann::json row = describe(c);
      row["kind"] = "prompt";
      row["seed"] = seed;
      add(row, eval.prompt(prompt_tokens, prompt_length, c, options));
    }
  }
  out["timing"] = timing(eval, 8, kMaxTokens, timing_rounds);
  out["meta"]["seconds"] = seconds_since(total_start);
  // The machine may be shared: the process's own CPU time, and the load it ran under.
  out["meta"]["cpu_seconds"] = static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
  out["meta"]["load_average_end"] = load_average();
  // Decoded fills may end inside a UTF-8 character.
  std::ofstream(output) << out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  std::fprintf(stderr, "wrote %s in %.0f s\n", output.c_str(), seconds_since(total_start));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ldlm_infill_eval: %s\n", e.what());
  return 1;
}
