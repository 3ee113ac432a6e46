// The machine's own arithmetic peak, measured in the same run as the layers, so
// bench/compare.py can state every rate as a share of what this CPU (this VM, at
// this moment's clocks) can do, rather than of a figure from a data sheet.
//
//   peak_fma_fp32   fp32 FMA throughput: independent accumulator chains of
//                   _mm512_fmadd_ps (zmm) when the CPU has AVX-512, else
//                   _mm256_fmadd_ps (ymm, AVX2 + FMA). 2 FLOPs per lane.
//   peak_dot_bf16   _mm512_dpbf16_ps (AVX512_BF16): 16 lanes x 2 bf16 pairs, so
//                   64 FLOPs per instruction, counted as an FMA on each pair. Skipped
//                   (reported as an error) on CPUs without AVX512_BF16.
//   peak_dot_int8   _mm512_dpbusd_epi32 (AVX512_VNNI): 16 lanes x 4 u8 x s8 pairs, so
//                   128 integer operations per instruction, counted as an FMA on each
//                   pair: the ceiling of int8 products (Precision::int8). Skipped on
//                   CPUs without AVX512_VNNI.
//   peak_amx_bf16   _tile_dpbf16ps (AMX-BF16) into 4 independent 16 x 16 fp32 tiles:
//                   a 16 x 32 by 32 x 16 product, 16384 FLOPs per instruction. The bf16
//                   peak of a CPU whose bf16 kernels are AMX; skipped on others, and
//                   where the kernel refuses the process AMX's register state.
//
// Each case runs on 1 and 2 threads of ldlm's own pool: one task per thread, each
// running the same loop for a fixed count. There are more chains than (latency x
// pipes) on current cores (FMA: 4-5 cycles x 2 pipes; vdpbf16ps: up to 6 x 2), so
// the loops are throughput-bound; the values converge (x <- a x + b with a < 1)
// and never reach subnormals or infinities.
//
// This file also puts the path that runs into the benchmark context (JSON
// "context", console header): the CPU's CPUID brand and features and the kernels
// ldlm chose for fp32 and bf16 (what `ldlm info` prints).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ldlm/ldlm.hpp"

#if defined(LDLM_HAVE_X86_SIMD)
#include <immintrin.h>
#define LDLM_BENCH_X86 1
#endif

namespace {

#if defined(LDLM_BENCH_X86)
constexpr int kZmmChains = 16;  // of 32 zmm registers; latency 4 x 2 pipes needs 8
constexpr int kYmmChains = 12;  // of 16 ymm registers; latency 5 x 2 pipes needs 10
constexpr int kDotChains = 16;  // vdpbf16ps and vpdpbusd: latency up to 6 x 2 pipes needs 12

// Each returns a sum of its accumulators so the loop cannot be dropped. (Lanes are
// summed through memory: GCC 12 warns inside _mm512_reduce_add_ps.)
float sum_lanes(const float* lanes, int n) {
  float total = 0;
  for (int i = 0; i < n; ++i) total += lanes[i];
  return total;
}

// kChains independent chains acc <- acc * a + b of FMAs on vectors V.
template <class V, int kChains>
LDLM_SIMD_KERNEL float fma_chains(std::int64_t iterations) {
  V acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = V::set1(0.5f + 0.01f * static_cast<float>(c));
  const V a = V::set1(0.999f), b = V::set1(0.001f);
  for (std::int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = fmadd(acc[c], a, b);
  }
  V sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = sum + acc[c];
  return ldlm::simd::sum_of_lanes(sum);
}

__attribute__((target("avx512f"))) float fma_zmm(std::int64_t iterations) {
  return fma_chains<ldlm::simd::F32x16, kZmmChains>(iterations);
}

__attribute__((target("avx2,fma"))) float fma_ymm(std::int64_t iterations) {
  return fma_chains<ldlm::simd::F32x8, kYmmChains>(iterations);
}

// Products of small bf16 values: each lane grows by 2 * 2^-20 per instruction, far
// from overflow after any count this benchmark runs.
__attribute__((target("avx512f,avx512bf16"))) float dot_bf16_zmm(std::int64_t iterations) {
  __m512 acc[kDotChains];
  for (int c = 0; c < kDotChains; ++c) acc[c] = _mm512_set1_ps(0.01f * static_cast<float>(c));
  const __m512 small = _mm512_set1_ps(1.0f / 1024);
  const __m512bh a = _mm512_cvtne2ps_pbh(small, small), b = _mm512_cvtne2ps_pbh(small, small);
  for (std::int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kDotChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kDotChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return sum_lanes(lanes, 16);
}

// s32 sums of u8 x s8 products of ones: each lane grows by 4 per instruction and wraps
// in the hardware, which is defined, whatever the count.
__attribute__((target("avx512f,avx512vnni"))) float dot_int8_zmm(std::int64_t iterations) {
  __m512i acc[kDotChains];
  for (int c = 0; c < kDotChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i ones = _mm512_set1_epi8(1);
  for (std::int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kDotChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], ones, ones);
  }
  __m512i sum = acc[0];
  for (int c = 1; c < kDotChains; ++c) sum = _mm512_add_epi32(sum, acc[c]);
  alignas(64) std::int32_t lanes[16];
  _mm512_store_si512(lanes, sum);
  float total = 0;
  for (const std::int32_t lane : lanes) total += static_cast<float>(lane);
  return total;
}
#endif

#if defined(LDLM_HAVE_AMX)
constexpr int kAmxChains = 4;  // tmm0-3 accumulate; latency ~4x the issue interval
using ldlm::detail::kAmxTileBytes;
using ldlm::detail::kAmxTileRows;

// Products of small bf16 values, as in dot_bf16_zmm: 32 · 2^-20 per element and
// instruction, far from overflow.
__attribute__((target("amx-tile,amx-bf16"))) float dot_bf16_amx(std::int64_t iterations) {
  alignas(64) std::uint16_t operand[kAmxTileRows * kAmxTileBytes / 2];
  for (std::uint16_t& v : operand) v = 0x3a80;  // bf16 2^-10
  ldlm::detail::load_full_tiles();              // (a memory barrier too: operand is written)
  alignas(64) float out[kAmxTileRows * kAmxTileBytes / 4];
  _tile_loadd(4, operand, kAmxTileBytes);  // tmm4-5: A tiles, tmm6-7: B tiles (the
  _tile_loadd(5, operand, kAmxTileBytes);  // three tiles of an instruction must differ)
  _tile_loadd(6, operand, kAmxTileBytes);
  _tile_loadd(7, operand, kAmxTileBytes);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float total = 0;
  _tile_stored(0, out, kAmxTileBytes);
  ldlm::detail::amx_memory_barrier();
  total += sum_lanes(out, 256);
  _tile_stored(1, out, kAmxTileBytes);
  ldlm::detail::amx_memory_barrier();
  total += sum_lanes(out, 256);
  _tile_stored(2, out, kAmxTileBytes);
  ldlm::detail::amx_memory_barrier();
  total += sum_lanes(out, 256);
  _tile_stored(3, out, kAmxTileBytes);
  ldlm::detail::amx_memory_barrier();
  total += sum_lanes(out, 256);
  _tile_release();
  return total;
}
#endif

// About 10^8 instructions per thread and iteration: 20-50 ms on current cores, long
// enough that waking the pool's workers (microseconds) does not count. An AMX
// iteration is 4 instructions of 16 cycles each: an eighth as many iterations.
constexpr std::int64_t kLoopCount = 6'000'000;

struct PeakKernel {
  const char* label = nullptr;  // null: this CPU has no such instruction
  float (*run)(std::int64_t) = nullptr;
  double flops_per_iteration = 0;
  std::int64_t iterations = kLoopCount;
};

PeakKernel fp32_fma_kernel() {
#if defined(LDLM_BENCH_X86)
  const ldlm::CpuFeatures& cpu = ldlm::cpu_features();
  if (cpu.avx512f) return {"zmm _mm512_fmadd_ps x16 chains", fma_zmm, 2.0 * 16 * kZmmChains};
  if (cpu.avx2 && cpu.fma) return {"ymm _mm256_fmadd_ps x12 chains", fma_ymm, 2.0 * 8 * kYmmChains};
#endif
  return {};
}

PeakKernel bf16_dot_kernel() {
#if defined(LDLM_BENCH_X86)
  if (ldlm::cpu_features().avx512_bf16) return {"zmm _mm512_dpbf16_ps x16 chains", dot_bf16_zmm, 64.0 * kDotChains};
#endif
  return {};
}

PeakKernel int8_dot_kernel() {
#if defined(LDLM_BENCH_X86)
  if (ldlm::cpu_features().avx512_vnni) return {"zmm _mm512_dpbusd_epi32 x16 chains", dot_int8_zmm, 128.0 * kDotChains};
#endif
  return {};
}

PeakKernel amx_bf16_kernel() {
#if defined(LDLM_HAVE_AMX)
  if (ldlm::amx_bf16_usable())
    return {"tmm _tile_dpbf16ps x4 tiles", dot_bf16_amx, 2.0 * 16 * 16 * 32 * kAmxChains, kLoopCount / 8};
#endif
  return {};
}

void run_peak(benchmark::State& state, const PeakKernel& kernel) {
  if (!kernel.run) {
    state.SkipWithError("this CPU has no such instruction (see the context's ldlm_cpu_features)");
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  ldlm::Context ctx(threads);
  float sink = 0;
  auto body = [&] {
    std::vector<float> partial(static_cast<std::size_t>(threads));
    ctx.pool().parallel_for(threads, [&](ldlm::Index task, int) {
      partial[static_cast<std::size_t>(task)] = kernel.run(kernel.iterations);
    });
    for (float v : partial) sink += v;
  };
  body();  // wakes the workers and brings the clocks up
  for (auto _ : state) body();
  benchmark::DoNotOptimize(sink);
  state.SetLabel(kernel.label);
  state.counters["FLOPS"] =
      benchmark::Counter(kernel.flops_per_iteration * static_cast<double>(kernel.iterations) * threads,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void BM_peak_fma_fp32(benchmark::State& state) { run_peak(state, fp32_fma_kernel()); }
void BM_peak_dot_bf16(benchmark::State& state) { run_peak(state, bf16_dot_kernel()); }
void BM_peak_dot_int8(benchmark::State& state) { run_peak(state, int8_dot_kernel()); }
void BM_peak_amx_bf16(benchmark::State& state) { run_peak(state, amx_bf16_kernel()); }

// The path that runs, once, before any benchmark (benchmark_main prints and writes
// the context after static initialisation).
const bool kContextAdded = [] {
  const ldlm::CpuFeatures& cpu = ldlm::cpu_features();
  const ldlm::GemmPaths paths = ldlm::gemm_paths();
  benchmark::AddCustomContext("ldlm_cpu_brand", cpu.brand.empty() ? "unknown" : cpu.brand);
  benchmark::AddCustomContext(
      "ldlm_cpu_id", cpu.vendor + ", family " + std::to_string(cpu.family) + ", model " + std::to_string(cpu.model));
  benchmark::AddCustomContext("ldlm_cpu_features", cpu.summary());
  benchmark::AddCustomContext("ldlm_products", ldlm::gemm_library());
  benchmark::AddCustomContext("ldlm_fp32_linear", paths.fp32_linear);
  benchmark::AddCustomContext("ldlm_fp32_attention", paths.fp32_attention);
  benchmark::AddCustomContext("ldlm_bf16_linear", paths.bf16_linear);
  benchmark::AddCustomContext("ldlm_bf16_attention", paths.bf16_attention);
  const PeakKernel fma = fp32_fma_kernel(), dot = bf16_dot_kernel(), int8 = int8_dot_kernel(),
                   amx = amx_bf16_kernel();
  benchmark::AddCustomContext("ldlm_peak_fp32_kernel", fma.label ? fma.label : "none");
  benchmark::AddCustomContext("ldlm_peak_bf16_kernel", dot.label ? dot.label : "none");
  benchmark::AddCustomContext("ldlm_peak_int8_kernel", int8.label ? int8.label : "none");
  benchmark::AddCustomContext("ldlm_peak_amx_kernel", amx.label ? amx.label : "none");
  return true;
}();

}  // namespace

BENCHMARK(BM_peak_fma_fp32)
    ->Name("peak_fma_fp32")
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peak_dot_bf16)
    ->Name("peak_dot_bf16")
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peak_dot_int8)
    ->Name("peak_dot_int8")
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peak_amx_bf16)
    ->Name("peak_amx_bf16")
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
