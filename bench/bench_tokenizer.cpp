// GPT-2 tokenizer throughput (encode and decode) on one UTF-8 text, to compare with
// OpenAI's tiktoken (its npm WASM build) on the same file, one process after the other:
//   cat /usr/share/common-licenses/* /usr/share/doc/*/copyright > /tmp/licenses.txt
//   LDLM_TOKENIZER_TEXT=/tmp/licenses.txt build/default/bench/ldlm_bench_tokenizer
//   (cd tools/reference/tokenizer && npm ci && node bench_tiktoken.mjs /tmp/licenses.txt)
// Without LDLM_TOKENIZER_TEXT the text is /usr/share/common-licenses/* concatenated.
// "MB" is the rate in 10^6 bytes of text per second, as bench_tiktoken.mjs prints it.
//   encode/cold  a new Tokenizer per iteration: its BPE cache starts empty (tiktoken
//                has no cache), loading not timed
//   encode/warm  one Tokenizer for all iterations, so the cache holds the text's words
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "ldlm/io/tokenizer.hpp"

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

const std::string& text() {
  static const std::string t = [] {
    if (const char* path = std::getenv("LDLM_TOKENIZER_TEXT")) return read_file(path);
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses"))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::string all;
    for (const auto& f : files) all += read_file(f);
    return all;
  }();
  return t;
}

struct Gpt2Files {
  std::string vocab = read_file(std::string(LDLM_GPT2_TOKENIZER_DIR) + "/encoder.json");
  std::string merges = read_file(std::string(LDLM_GPT2_TOKENIZER_DIR) + "/vocab.bpe");
  ldlm::Tokenizer load() const { return ldlm::Tokenizer::from_vocab_and_merges(vocab, merges); }
};

const Gpt2Files& gpt2_files() {
  static const Gpt2Files files;
  return files;
}

void report(benchmark::State& state, std::size_t bytes, std::size_t tokens) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.counters["MB"] = benchmark::Counter(static_cast<double>(bytes) * 1e-6 * static_cast<double>(state.iterations()),
                                            benchmark::Counter::kIsRate);
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["tokens"] = static_cast<double>(tokens);
}

void BM_TokenizerEncodeCold(benchmark::State& state) {
  const std::string& t = text();
  std::size_t tokens = 0;
  std::optional<ldlm::Tokenizer> tokenizer;
  for (auto _ : state) {
    state.PauseTiming();
    tokenizer.reset();  // neither freeing nor loading is timed
    tokenizer.emplace(gpt2_files().load());
    state.ResumeTiming();
    tokens = tokenizer->encode(t).size();
  }
  report(state, t.size(), tokens);
}
BENCHMARK(BM_TokenizerEncodeCold)->Name("tokenizer_encode/cold")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TokenizerEncodeWarm(benchmark::State& state) {
  const std::string& t = text();
  const ldlm::Tokenizer tokenizer = gpt2_files().load();
  tokenizer.encode(t);  // fills the cache
  std::size_t tokens = 0;
  for (auto _ : state) tokens = tokenizer.encode(t).size();
  report(state, t.size(), tokens);
}
BENCHMARK(BM_TokenizerEncodeWarm)->Name("tokenizer_encode/warm")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TokenizerDecode(benchmark::State& state) {
  const std::string& t = text();
  const ldlm::Tokenizer tokenizer = gpt2_files().load();
  const auto ids = tokenizer.encode(t);
  for (auto _ : state) benchmark::DoNotOptimize(tokenizer.decode(ids));
  report(state, t.size(), ids.size());
}
BENCHMARK(BM_TokenizerDecode)->Name("tokenizer_decode")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TokenizerLoad(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(gpt2_files().load());
}
BENCHMARK(BM_TokenizerLoad)->Name("tokenizer_load")->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
