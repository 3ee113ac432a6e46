// Microbenchmarks of ldlm's layers and modules at ldlm-base sizes (B = 1, T = 1024,
// d = 768, H = 12, hd = 64), each at 1 and 2 threads and in both precisions: fp32
// (bf16:0) and bf16 (bf16:1: bf16 operands, fp32 sums, fp32 norms/softmax/residuals,
// see docs/model.md §Precision). bench/torch_bench.py times the same computations in
// PyTorch (fp32, and under torch.autocast bf16) under the same case names, and
// bench/compare.py puts the two side by side with the machine's measured peak
// (bench_peak.cpp; see bench/README.md).
//
// Every case reports a FLOPS counter of *useful* FLOPs, the same in both precisions,
// so rates compare across implementations that do more or less redundant work:
//   linear     2 · rows · in · out            (biases not counted)
//   attention  4 · Tq · Tk · d                (QKᵀ and PV over all heads)
//   causal     2 · T · (T + 1) · d            (only the keys each query may see)
// Norms, activations, rotary, softmax and residual adds are not counted, except in
// the LayerNorm case, which has nothing else (6 · rows · d, see there).
//
// Weights come from init_parameters(module, 1, "", precision), which packs them for
// the kernel of that precision; inputs are uniform in [-1, 1). Modules run through
// their row forms into preallocated outputs, as a sampling loop calls them; the
// rotary table, which a model builds once per sequence length and shares across
// layers, is built outside the timed loop. Each case's label names the precision
// and the kernels of its packed weights.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <typeinfo>
#include <vector>

#include "ldlm/ldlm.hpp"

namespace {

using S = float;
using ldlm::Index;
using Mat = ldlm::Matrix<S>;

constexpr Index kB = 1;
constexpr Index kT = 1024;
const ldlm::Config kBase{};  // ldlm-base
const double kD = static_cast<double>(kBase.d_model);
const double kHidden = static_cast<double>(kBase.mlp_hidden());

double linear_flops(double rows, double in, double out) { return 2 * rows * in * out; }
double attention_flops(double Tq, double Tk, double d) { return 4 * Tq * Tk * d; }
double causal_attention_flops(double T, double d) { return 2 * T * (T + 1) * d; }

Mat random_matrix(Index rows, Index cols, unsigned seed) {
  std::srand(seed);
  return Mat::Random(rows, cols);
}

int thread_arg(const benchmark::State& state) { return static_cast<int>(state.range(0)); }
ldlm::Precision precision_arg(const benchmark::State& state, int index = 1) {
  return state.range(index) ? ldlm::Precision::bf16 : ldlm::Precision::fp32;
}

// Google Benchmark calls a case function several times while it settles the
// iteration count, and once per argument: building and initialising a 130 M
// parameter module each time would dominate the run. The modules of one case name
// stay alive, one per precision (the last name asked for), so memory stays at about
// 1.5x the largest module.
struct CachedModule {
  std::shared_ptr<void> module;
  std::string label;  // precision and the kernels of its packed weights
};
struct ModuleCache {
  std::string key;
  std::map<ldlm::Precision, CachedModule> modules;
};
ModuleCache& module_cache() {
  static ModuleCache cache;
  return cache;
}

// "bf16 linear brg:avx512_core_bf16": the distinct kernels the module's weights were packed for.
template <class M>
std::string kernel_label(M& module, ldlm::Precision precision) {
  std::set<std::string> kernels;
  module.visit("", [&](const std::string&, auto& p) {
    if constexpr (requires { p.packed(); })
      if (p.packed()) kernels.insert(p.packed()->kernel());
  });
  std::string label(ldlm::precision_name(precision));
  if (!kernels.empty()) label += " linear";
  for (const auto& k : kernels) label += " " + k;
  return label;
}

template <class M, class Make>
const M& cached_module(benchmark::State& state, const std::string& name, ldlm::Precision precision, Make make) {
  ModuleCache& cache = module_cache();
  const std::string key = name + "|" + typeid(M).name();
  if (cache.key != key) {
    cache.modules.clear();  // free the previous modules before building the next
    cache.key = key;
  }
  CachedModule& entry = cache.modules[precision];
  if (!entry.module) {
    auto m = std::make_shared<M>(make());
    ldlm::init_parameters(*m, 1, "", precision);
    entry.label = kernel_label(*m, precision);
    entry.module = m;
  }
  state.SetLabel(entry.label);
  return *static_cast<const M*>(entry.module.get());
}

// Two untimed calls first, as a sampling loop's first two steps: the first grows the
// context's arena, whose blocks are merged into one when it ends; the second faults in
// that block's pages (core/context.hpp). From the third call on, a call touches no
// fresh page, which is the cost per step of a loop (bench/results/README.md, "the
// arena's second call").
template <class Body>
void run_case(benchmark::State& state, double flops, Body&& body) {
  body();
  body();
  for (auto _ : state) {
    body();
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

// Names like "denoiser/threads:1/bf16:0/real_time".
void per_thread_count_and_precision(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "bf16"})->ArgsProduct({{1, 2}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
}

// --- reference point ---------------------------------------------------------

// [1024, 768] · [768, 3072] through ldlm::linear on a weight packed for the
// precision (nn.Linear layout, w [3072, 768]), as every module's products run.
// FLOPs: 2 · 1024 · 768 · 3072.
void BM_gemm(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const ldlm::Precision precision = precision_arg(state);
  const Mat x = random_matrix(1024, 768, 1);
  const auto w = ldlm::PackedMatrix::pack(random_matrix(3072, 768, 2), ldlm::WeightLayout::out_in, precision);
  Mat y(1024, 3072);
  state.SetLabel(std::string(ldlm::precision_name(precision)) + " linear " + w.kernel());
  run_case(state, linear_flops(1024, 768, 3072), [&] { ldlm::linear(ctx, x, w, nullptr, y); });
}

// --- layers --------------------------------------------------------------------

// Gain-only fp32 LayerNorm over [B·T, d]. FLOPs (a convention: element-wise work,
// no products): 6 · B·T · d (mean, centre, square-accumulate ×2, normalise, gain).
void BM_layer_norm_gain(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& norm = cached_module<ldlm::nn::LayerNormGain<S>>(state, "layer_norm_gain", precision_arg(state), [] {
    return ldlm::nn::LayerNormGain<S>(kBase.d_model, kBase.layer_norm_eps);
  });
  const Mat x = random_matrix(kB * kT, kBase.d_model, 1);
  Mat y(kB * kT, kBase.d_model);
  run_case(state, 6 * kB * kT * kD, [&] { norm.forward(ctx, x, y); });
}

// Denoiser fused self-attention incl. attn_qkv and attn_out, rotary, softcap.
// FLOPs: 2·T·d·3d + 2·T·d·d + 4·T²·d = 8·T·d² + 4·T²·d.
void BM_attn_denoiser(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& attn = cached_module<ldlm::nn::FusedSelfAttention<S>>(state, "attn_denoiser", precision_arg(state), [] {
    return ldlm::nn::FusedSelfAttention<S>(ldlm::denoiser_attention_config(kBase));
  });
  ldlm::Arena rotary_arena;
  const auto rotary = ldlm::make_rotary_table<S>(rotary_arena, kT, kBase.head_dim, kBase.rope_base);
  const Mat x = random_matrix(kB * kT, kBase.d_model, 1);
  Mat y(kB * kT, kBase.d_model);
  const double flops =
      linear_flops(kB * kT, kD, 3 * kD) + linear_flops(kB * kT, kD, kD) + kB * attention_flops(kT, kT, kD);
  run_case(state, flops, [&] { attn.forward(ctx, x, kB, kT, &rotary, y); });
}

// Token decoder self-attention: q/k/v/o projections, rotary, softcap.
// FLOPs: 4 · 2·T·d·d + 4·T²·d = 8·T·d² + 4·T²·d.
void BM_attn_token_decoder(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& attn = cached_module<ldlm::nn::SelfAttention<S>>(state, "attn_token_decoder", precision_arg(state), [] {
    return ldlm::nn::SelfAttention<S>(ldlm::token_decoder_attention_config(kBase));
  });
  ldlm::Arena rotary_arena;
  const auto rotary = ldlm::make_rotary_table<S>(rotary_arena, kT, kBase.head_dim, kBase.rope_base);
  const Mat x = random_matrix(kB * kT, kBase.d_model, 1);
  Mat y(kB * kT, kBase.d_model);
  const double flops = 4 * linear_flops(kB * kT, kD, kD) + kB * attention_flops(kT, kT, kD);
  run_case(state, flops, [&] { attn.forward(ctx, x, kB, kT, &rotary, y); });
}

// Perceiver latent attention, Tq = Tc = T, so 2T keys: RMSNorms, latents_to_Q,
// latents_to_KV, embeddings_to_KV, qk-norm, softcap, projector_latents.
// FLOPs: 2·T·d·d + 2·T·d·2d + 2·T·d·2d + 2·T·d·d + 4·T·2T·d = 12·T·d² + 8·T²·d.
void BM_attn_latent(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& attn = cached_module<ldlm::nn::LatentAttention<S>>(state, "attn_latent", precision_arg(state), [] {
    return ldlm::nn::LatentAttention<S>(ldlm::latent_attention_config(kBase));
  });
  const Mat context = random_matrix(kB * kT, kBase.d_model, 1), queries = random_matrix(kB * kT, kBase.d_model, 2);
  Mat y(kB * kT, kBase.d_model);
  const double rows = kB * kT;
  const double flops = linear_flops(rows, kD, kD) + 2 * linear_flops(rows, kD, 2 * kD) + linear_flops(rows, kD, kD) +
                       kB * attention_flops(kT, 2 * kT, kD);
  run_case(state, flops, [&] { attn.forward(ctx, context, kT, queries, kB, kT, y); });
}

// GPT-2 causal attention: c_attn, causal softmax, c_proj.
// FLOPs: 2·T·d·3d + 2·T·d·d + 2·T·(T+1)·d = 8·T·d² + 2·T·(T+1)·d.
void BM_attn_gpt2(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& attn = cached_module<ldlm::nn::GPT2Attention<S>>(state, "attn_gpt2", precision_arg(state), [] {
    return ldlm::nn::GPT2Attention<S>(ldlm::gpt2_attention_config(kBase), ldlm::Role::frozen);
  });
  const Mat x = random_matrix(kB * kT, kBase.d_model, 1);
  Mat y(kB * kT, kBase.d_model);
  const double flops =
      linear_flops(kB * kT, kD, 3 * kD) + linear_flops(kB * kT, kD, kD) + kB * causal_attention_flops(kT, kD);
  run_case(state, flops, [&] { attn.forward(ctx, x, kB, kT, y); });
}

// --- blocks and modules ----------------------------------------------------------

// Useful FLOPs count the per-token weights at 2·T and the attention products;
// adaLN and the time MLP, which act once per sequence, are left out (issue 7).
double ddit_block_flops(double T) {
  return linear_flops(kB * T, kD, 3 * kD) + linear_flops(kB * T, kD, kD) + kB * attention_flops(T, T, kD)  // attention
         + linear_flops(kB * T, kD, kHidden) + linear_flops(kB * T, kHidden, kD);                          // MLP
}

// One DDiT block (adaLN, 2 norms + modulate, attention, GELU MLP, gated residuals).
// The block updates x in place, so each iteration first restores x from the input
// (a 3 MB copy, well under 1% of the block).
// FLOPs: 8·T·d² + 4·T²·d + 2·T·d·4d·2 = 24·T·d² + 4·T²·d (adaLN not counted).
void BM_ddit_block(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& block = cached_module<ldlm::Denoiser<S>::Block>(state, "ddit_block", precision_arg(state),
                                                              [] { return ldlm::Denoiser<S>::Block(kBase); });
  ldlm::Arena rotary_arena;
  const auto rotary = ldlm::make_rotary_table<S>(rotary_arena, kT, kBase.head_dim, kBase.rope_base);
  const Mat input = random_matrix(kB * kT, kBase.d_model, 1), c = random_matrix(kB, kBase.d_model, 2);
  Mat x(kB * kT, kBase.d_model);
  run_case(state, ddit_block_flops(kT), [&] {
    x = input;
    block.forward(ctx, x, c, kB, kT, rotary);
  });
}

// Denoiser FLOPs: input_proj 2·T·2d·d, 12 blocks, output linear 2·T·d·d
//   = 294·T·d² + 48·T²·d  (time MLP and the adaLN projections not counted).
double denoiser_flops(double T) {
  const double blocks = static_cast<double>(kBase.denoiser_blocks);
  return linear_flops(kB * T, 2 * kD, kD) + blocks * ddit_block_flops(T) + linear_flops(kB * T, kD, kD);
}

void denoiser_case(benchmark::State& state, Index T, int threads, ldlm::Precision precision) {
  ldlm::Context ctx(threads);
  const auto& denoiser =
      cached_module<ldlm::Denoiser<S>>(state, "denoiser", precision, [] { return ldlm::Denoiser<S>(kBase); });
  ldlm::Arena rotary_arena;
  const auto rotary = ldlm::make_rotary_table<S>(rotary_arena, T, kBase.head_dim, kBase.rope_base);
  const Mat x_t = random_matrix(kB * T, kBase.d_model, 1), self_cond = random_matrix(kB * T, kBase.d_model, 2);
  const std::vector<S> t(kB, S(0.5));
  Mat x0(kB * T, kBase.d_model);
  run_case(state, denoiser_flops(static_cast<double>(T)),
           [&] { denoiser.forward(ctx, x_t, t.data(), self_cond, kB, T, rotary, x0); });
}

// Full denoiser forward: one sampling step, 12 blocks, with a self-conditioning input.
void BM_denoiser(benchmark::State& state) { denoiser_case(state, kT, thread_arg(state), precision_arg(state)); }

// The same at T = 128 .. 1024, for the scaling table (args T, threads, bf16).
void BM_denoiser_T(benchmark::State& state) {
  denoiser_case(state, state.range(0), static_cast<int>(state.range(1)), precision_arg(state, 2));
}

// The same in int8 (args T, threads): the blocks' Linear maps on int8 kernels, the rest
// as bf16 (ldlm::Precision::int8). Left out where int8 is refused (no VNNI or AMX-INT8).
void BM_denoiser_int8_T(benchmark::State& state) {
  if (const std::string why = ldlm::int8_unavailable_reason(); !why.empty()) return state.SkipWithError(why.c_str());
  denoiser_case(state, state.range(0), static_cast<int>(state.range(1)), ldlm::Precision::int8);
}

// Perceiver layer: latent attention (12·T·d² + 8·T²·d) + FFN 2·T·d·4d·2 (16·T·d²).
double perceiver_layer_flops(double T) {
  return linear_flops(kB * T, kD, kD) + 2 * linear_flops(kB * T, kD, 2 * kD) + linear_flops(kB * T, kD, kD) +
         kB * attention_flops(T, 2 * T, kD) + linear_flops(kB * T, kD, kHidden) + linear_flops(kB * T, kHidden, kD);
}

// Latent encoder, 6 layers. FLOPs: 6 · (28·T·d² + 8·T²·d) = 168·T·d² + 48·T²·d.
void BM_latent_encoder(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& encoder = cached_module<ldlm::LatentEncoder<S>>(state, "latent_encoder", precision_arg(state),
                                                              [] { return ldlm::LatentEncoder<S>(kBase); });
  const Mat features = random_matrix(kB * kT, kBase.d_model, 1);
  Mat latents(kB * kT, kBase.d_model);
  const double flops = static_cast<double>(kBase.encoder_layers) * perceiver_layer_flops(kT);
  run_case(state, flops, [&] { encoder.forward(ctx, features, kB, kT, latents); });
}

// Latent decoder, 6 blocks plus the mask-vector FFN on one row.
// FLOPs: 6 · (28·T·d² + 8·T²·d) + 2·d·4d·2 = 168·T·d² + 48·T²·d + 16·d².
void BM_latent_decoder(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& decoder = cached_module<ldlm::LatentDecoder<S>>(state, "latent_decoder", precision_arg(state),
                                                              [] { return ldlm::LatentDecoder<S>(kBase); });
  const Mat latents = random_matrix(kB * kT, kBase.d_model, 1);
  Mat hidden(kB * kT, kBase.d_model);
  const double flops = static_cast<double>(kBase.latent_decoder_layers) * perceiver_layer_flops(kT) +
                       linear_flops(1, kD, kHidden) + linear_flops(1, kHidden, kD);
  run_case(state, flops, [&] { decoder.forward(ctx, latents, kB, kT, hidden); });
}

// Token decoder, 3 blocks and the V = 50259 lm_head (logits [T, V], 206 MB).
// Block: attention 8·T·d² + 4·T²·d, SwiGLU 3 · 2·T·d·3072 (= 24·T·d² at 3072 = 4d).
// FLOPs: 3 · (32·T·d² + 4·T²·d) + 2·T·d·V = 96·T·d² + 12·T²·d + 2·T·d·V.
void BM_token_decoder(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& decoder = cached_module<ldlm::TokenDecoder<S>>(state, "token_decoder", precision_arg(state),
                                                             [] { return ldlm::TokenDecoder<S>(kBase); });
  const Mat hidden = random_matrix(kB * kT, kBase.d_model, 1);
  Mat logits(kB * kT, kBase.vocab_size);
  const double swiglu_hidden = static_cast<double>(kBase.token_decoder_mlp_hidden);
  const double block = 4 * linear_flops(kB * kT, kD, kD) + kB * attention_flops(kT, kT, kD) +
                       2 * linear_flops(kB * kT, kD, swiglu_hidden) + linear_flops(kB * kT, swiglu_hidden, kD);
  const double flops = static_cast<double>(kBase.token_decoder_layers) * block +
                       linear_flops(kB * kT, kD, static_cast<double>(kBase.vocab_size));
  run_case(state, flops, [&] { decoder.forward(ctx, hidden, kB, kT, logits); });
}

// GPT-2 features: embeddings and the 10 blocks that feed hidden_states[-3].
// Block: 8·T·d² + 2·T·(T+1)·d (causal) + 16·T·d² (MLP).
// FLOPs: 10 · (24·T·d² + 2·T·(T+1)·d) = 240·T·d² + 20·T·(T+1)·d.
void BM_gpt2_features(benchmark::State& state) {
  ldlm::Context ctx(thread_arg(state));
  const auto& gpt2 = cached_module<ldlm::GPT2Features<S>>(state, "gpt2_features", precision_arg(state),
                                                          [] { return ldlm::GPT2Features<S>(kBase); });
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(kB * kT));
  std::srand(1);
  for (auto& id : tokens) id = std::rand() % kBase.vocab_size;
  Mat features(kB * kT, kBase.d_model);
  const double block = linear_flops(kB * kT, kD, 3 * kD) + linear_flops(kB * kT, kD, kD) +
                       kB * causal_attention_flops(kT, kD) + linear_flops(kB * kT, kD, kHidden) +
                       linear_flops(kB * kT, kHidden, kD);
  const double flops = static_cast<double>(kBase.gpt2_feature_layers) * block;
  run_case(state, flops, [&] { gpt2.forward(ctx, tokens.data(), kB, kT, features); });
}

}  // namespace

BENCHMARK(BM_gemm)->Name("gemm")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_layer_norm_gain)->Name("layer_norm_gain")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_attn_denoiser)->Name("attn_denoiser")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_attn_token_decoder)->Name("attn_token_decoder")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_attn_latent)->Name("attn_latent")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_attn_gpt2)->Name("attn_gpt2")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_ddit_block)->Name("ddit_block")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_denoiser)->Name("denoiser")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_denoiser_T)
    ->Name("denoiser_T")
    ->ArgNames({"T", "threads", "bf16"})
    ->ArgsProduct({{128, 256, 512, 1024}, {1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_denoiser_int8_T)
    ->Name("denoiser_int8_T")
    ->ArgNames({"T", "threads"})
    ->ArgsProduct({{128, 256, 512, 1024}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_latent_encoder)->Name("latent_encoder")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_latent_decoder)->Name("latent_decoder")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_token_decoder)->Name("token_decoder")->Apply(per_thread_count_and_precision);
BENCHMARK(BM_gpt2_features)->Name("gpt2_features")->Apply(per_thread_count_and_precision);
