// The element-wise SIMD kernels on their own: attention's softmax rows and the bf16
// conversions. The layer benchmarks (bench_layers.cpp) hide them inside products; here a
// change to one kernel shows as its own figure (issue 29 measured every kernel before and
// after it was rewritten over one vector type; bench/results/README.md has the figures).
//
// Every case names its instruction set, so that the AVX2 kernel is measured on an AVX-512
// machine as well; a case whose instructions this CPU lacks is skipped with a message.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ldlm/core/cpu.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/ops/softmax.hpp"

namespace {

using ldlm::Index;

// Attention scores of a trained model lie within a few units of 0; `spread` 60 sends
// most of them past the softcap's polynomial range, into tanh's slow lanes.
std::vector<float> scores(Index n, float spread, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

enum class Isa { avx512, avx2, generic };

bool skip_unless_supported(benchmark::State& state, Isa isa) {
  const auto& f = ldlm::cpu_features();
  const bool ok = isa == Isa::generic || (isa == Isa::avx2 && f.avx2 && f.fma) ||
                  (isa == Isa::avx512 && f.avx512f && f.avx512dq);
  if (!ok) state.SkipWithError("this CPU lacks the kernel's instructions");
  return !ok;
}

float exp_row(Isa isa, float* row, Index n, float cap) {
  switch (isa) {
#if defined(LDLM_HAVE_AVX512_SOFTMAX)
    case Isa::avx512: return ldlm::detail::exp_shifted_capped_avx512(row, n, cap);
    case Isa::avx2: return ldlm::detail::exp_shifted_capped_avx2(row, n, cap);
#else
    case Isa::avx512:
    case Isa::avx2:
#endif
    case Isa::generic: break;
  }
  return ldlm::detail::exp_shifted_capped_generic(row, n, cap);
}

// One row of n scores: restored from its source, then exponentiated in place. The copy
// is part of every case's time (a few percent of it at n = 1024), and equal in all.
void BM_softmax_row(benchmark::State& state, Isa isa, float cap, float spread) {
  if (skip_unless_supported(state, isa)) return;
  const Index n = state.range(0);
  const std::vector<float> source = scores(n, spread, 7);
  std::vector<float> row(source.size());
  for (auto _ : state) {
    std::memcpy(row.data(), source.data(), source.size() * sizeof(float));
    benchmark::DoNotOptimize(exp_row(isa, row.data(), n, cap));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

#if defined(LDLM_HAVE_AVX512_SOFTMAX)
// bf16 attention's row: scale, cap, exponential, normalisation and rounding to bf16.
void BM_softmax_row_to_bf16(benchmark::State& state, float cap) {
  const auto& f = ldlm::cpu_features();
  if (!(f.avx512f && f.avx512dq && f.avx512bw && f.avx512_bf16)) {
    state.SkipWithError("this CPU lacks AVX512_BF16");
    return;
  }
  const Index n = state.range(0);
  const std::vector<float> source = scores(n, 40.0f, 7);
  std::vector<float> row(source.size());
  std::vector<ldlm::bf16> probabilities(source.size());
  for (auto _ : state) {
    std::memcpy(row.data(), source.data(), source.size() * sizeof(float));
    ldlm::detail::softmax_row_to_bf16_avx512(row.data(), n, n, 0.125f, cap, probabilities.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
#endif

// The conversions run over whole activations: n = 4096 stays in L1, 768 · 1024 (an
// activation of ldlm-base at T = 1024) in L2/L3.
void BM_to_bf16(benchmark::State& state) {
  const Index n = state.range(0);
  const std::vector<float> x = scores(n, 3.0f, 1);
  std::vector<ldlm::bf16> y(x.size());
  for (auto _ : state) {
    ldlm::to_bf16(x.data(), n, y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 6);
}

void BM_bf16_to_float(benchmark::State& state) {
  const Index n = state.range(0);
  std::vector<ldlm::bf16> x(static_cast<std::size_t>(n));
  ldlm::to_bf16(scores(n, 3.0f, 1).data(), n, x.data());
  std::vector<float> y(x.size());
  for (auto _ : state) {
    ldlm::bf16_to_float(x.data(), n, y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 6);
}

void BM_round_to_bf16(benchmark::State& state) {
  const Index n = state.range(0);
  const std::vector<float> x = scores(n, 3.0f, 1);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    ldlm::round_to_bf16(x.data(), n, y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 8);
}

}  // namespace

BENCHMARK_CAPTURE(BM_softmax_row, avx512_cap50, Isa::avx512, 50.0f, 3.0f)->Name("softmax_row/avx512/cap50")->Arg(64)->Arg(1024);
BENCHMARK_CAPTURE(BM_softmax_row, avx512_cap50_wide, Isa::avx512, 50.0f, 60.0f)->Name("softmax_row/avx512/cap50_wide")->Arg(1024);
BENCHMARK_CAPTURE(BM_softmax_row, avx512_nocap, Isa::avx512, 0.0f, 3.0f)->Name("softmax_row/avx512/nocap")->Arg(1024);
BENCHMARK_CAPTURE(BM_softmax_row, avx2_cap50, Isa::avx2, 50.0f, 3.0f)->Name("softmax_row/avx2/cap50")->Arg(64)->Arg(1024);
BENCHMARK_CAPTURE(BM_softmax_row, avx2_cap50_wide, Isa::avx2, 50.0f, 60.0f)->Name("softmax_row/avx2/cap50_wide")->Arg(1024);
BENCHMARK_CAPTURE(BM_softmax_row, avx2_nocap, Isa::avx2, 0.0f, 3.0f)->Name("softmax_row/avx2/nocap")->Arg(1024);
BENCHMARK_CAPTURE(BM_softmax_row, generic_cap50, Isa::generic, 50.0f, 3.0f)->Name("softmax_row/generic/cap50")->Arg(1024);
#if defined(LDLM_HAVE_AVX512_SOFTMAX)
BENCHMARK_CAPTURE(BM_softmax_row_to_bf16, cap50, 50.0f)->Name("softmax_row_to_bf16/cap50")->Arg(1024);
BENCHMARK_CAPTURE(BM_softmax_row_to_bf16, nocap, 0.0f)->Name("softmax_row_to_bf16/nocap")->Arg(1024);
#endif
BENCHMARK(BM_to_bf16)->Name("to_bf16")->Arg(64)->Arg(4096)->Arg(768 * 1024);
BENCHMARK(BM_bf16_to_float)->Name("bf16_to_float")->Arg(4096)->Arg(768 * 1024);
BENCHMARK(BM_round_to_bf16)->Name("round_to_bf16")->Arg(4096)->Arg(768 * 1024);
