// The sampler (sampling/sampler.hpp, docs/model.md §Sampler) on model_small's architecture
// with generated weights: reproducibility, the latents as the last deterministic mean,
// progress/cancellation, argument checks, and the absence of heap allocation inside the loop.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

// Counting operator new: only while g_count_allocations is set (inside the
// sampling loop of one test). Weak, so that another test TU replacing operator new
// wins without a link error; the test then detects that counting is inactive.
namespace {
std::atomic<bool> g_count_allocations{false};
std::atomic<long> g_allocations{0};
std::atomic<std::size_t> g_largest_allocation{0};
}  // namespace

__attribute__((weak)) void* operator new(std::size_t n) {
  if (g_count_allocations.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    for (std::size_t seen = g_largest_allocation.load();
         n > seen && !g_largest_allocation.compare_exchange_weak(seen, n);) {
    }
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
__attribute__((weak)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((weak)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace ldlm {
namespace unit_sampling_sampler {
namespace {

using test::data_path;
using ::testing::HasSubstr;

// The model_small architecture (d = 64, 2 denoiser blocks, V = 101) with generator
// weights (seed 7): sampling takes milliseconds. Random weights make the decoders
// nearly blind to the latents (one token per sequence), so token-level checks use
// a case whose argmax margin is large (1.43 vs 0.98), and latent-level checks
// carry the rest.
Config small_config() { return Config::load(data_path("model_small/config.json")); }

struct SmallModel {
  LDLM<float> model{small_config()};
  SmallModel() {
    init_parameters(model.denoiser, 7, "denoiser.");
    init_parameters(model.latent_decoder, 7, "latent_decoder.");
    init_parameters(model.token_decoder, 7, "token_decoder.");
  }
};

const LDLM<float>& small_model() {
  static const SmallModel m;
  return m.model;
}

// The original sampler's options: Euler on the even grid, the result x at t_min.
SamplerOptions options(std::uint64_t seed, SamplerKind kind = SamplerKind::sde, int steps = 6) {
  SamplerOptions o;
  o.seed = seed;
  o.kind = kind;
  o.steps = steps;
  o.endpoint = Endpoint::sample;
  o.grid.grid = TimeGrid::uniform;
  return o;
}

bool same(const TokenTensor& a, const TokenTensor& b) {
  return shape_of(a) == shape_of(b) && std::equal(a.data(), a.data() + a.size(), b.data());
}

bool same(const Tensor3<float>& a, const Tensor3<float>& b) {
  return shape_of(a) == shape_of(b) && std::equal(a.data(), a.data() + a.size(), b.data());
}

TEST(Sampler, SameSeedSameResultDifferentSeedDifferentResult) {
  const Pipeline<float> pipeline(small_model());
  Context ctx(1);
  for (SamplerKind kind : {SamplerKind::sde, SamplerKind::ode}) {
    const TokenTensor a = pipeline.generate(ctx, 2, 16, options(1, kind, 4));
    const TokenTensor b = pipeline.generate(ctx, 2, 16, options(1, kind, 4));
    ASSERT_EQ(shape_of(a), (Shape{2, 16}));
    EXPECT_TRUE(same(a, b)) << "same seed must give identical tokens";
    for (Index i = 0; i < a.size(); ++i) {
      EXPECT_GE(a.data()[i], 0);
      EXPECT_LT(a.data()[i], 101);
    }
    EXPECT_TRUE(
        same(pipeline.sample(ctx, 2, 16, options(1, kind, 4)), pipeline.sample(ctx, 2, 16, options(1, kind, 4))));
    EXPECT_FALSE(
        same(pipeline.sample(ctx, 2, 16, options(1, kind, 4)), pipeline.sample(ctx, 2, 16, options(2, kind, 4))))
        << "a different seed must give different latents";
  }
  // Every solver: a seed reproduces its latents; the stochastic ones change with the seed.
  for (const SamplerInfo& info : kSamplers) {
    SamplerOptions a = options(1, info.kind, 4), b = options(2, info.kind, 4);
    a.grid.grid = b.grid.grid = TimeGrid::karras;
    const Tensor3<float> first = pipeline.sample(ctx, 2, 16, a);
    EXPECT_TRUE(same(first, pipeline.sample(ctx, 2, 16, a))) << info.name << ": same seed, other latents";
    EXPECT_FALSE(same(first, pipeline.sample(ctx, 2, 16, b))) << info.name << ": the seed must matter";
  }
  const TokenTensor one = pipeline.generate(ctx, 2, 16, options(1, SamplerKind::sde, 4));
  const TokenTensor two = pipeline.generate(ctx, 2, 16, options(2, SamplerKind::sde, 4));
  EXPECT_FALSE(same(one, two)) << "a different seed must give different tokens";
  EXPECT_FALSE(same(pipeline.sample(ctx, 2, 16, options(1, SamplerKind::sde, 4)),
                    pipeline.sample(ctx, 2, 16, options(1, SamplerKind::ode, 4))))
      << "the SDE's noise must matter";
}

// A model's model times reach the denoiser with the fitted grid they go with, and only then:
// at the grid's own times they change nothing bit for bit, offset they change the latents;
// another grid, or Heun (two calls per step), ignores them.
TEST(Sampler, ModelTimesGoWithTheirFittedGrid) {
  const Pipeline<float> pipeline(small_model());
  Context ctx(1);
  const int steps = 4;
  const Config& c = small_model().config;
  const std::vector<double> grid =
      time_grid(steps, c.t_min, TangentSchedule::from_config(c), TimeGridOptions{TimeGrid::lambda});
  const std::vector<double> own(grid.begin(), grid.end() - 1);
  std::vector<double> moved = own;
  for (std::size_t i = 1; i < moved.size(); ++i) moved[i] *= 0.8;
  const auto sample = [&](SamplerKind kind, TimeGrid which, const std::vector<double>& model_times) {
    SamplerOptions o = options(3, kind, steps);
    o.grid.grid = which;
    o.grid.fitted = {{steps, grid}};
    if (!model_times.empty()) o.grid.model_times = {{steps, model_times}};
    return pipeline.sample(ctx, 1, 8, o);
  };
  const Tensor3<float> plain = sample(SamplerKind::unipc_3m, TimeGrid::automatic, {});
  EXPECT_TRUE(same(plain, sample(SamplerKind::unipc_3m, TimeGrid::automatic, own)));
  EXPECT_FALSE(same(plain, sample(SamplerKind::unipc_3m, TimeGrid::automatic, moved))) << "auto ignored them";
  EXPECT_FALSE(same(plain, sample(SamplerKind::unipc_3m, TimeGrid::fitted, moved))) << "fitted ignored them";
  EXPECT_TRUE(
      same(sample(SamplerKind::unipc_3m, TimeGrid::karras, {}), sample(SamplerKind::unipc_3m, TimeGrid::karras, moved)))
      << "another grid than theirs used them";
  EXPECT_TRUE(
      same(sample(SamplerKind::heun, TimeGrid::automatic, {}), sample(SamplerKind::heun, TimeGrid::automatic, moved)))
      << "heun used them";
}

TEST(Sampler, LatentsAreTheLastDeterministicMean) {
  // Replay the sampler by hand with the same generator: N steps, self-conditioning,
  // no noise in the final step.
  const LDLM<float>& model = small_model();
  Context ctx(1);
  const Index B = 2, T = 5, d = 64, n = B * T * d;
  const int steps = 3;
  const Tensor3<float> z = sample_latents(ctx, model.denoiser, B, T, options(9, SamplerKind::sde, steps));

  NormalGenerator rng(9);
  Tensor3<float> x(B, T, d), self_cond(B, T, d);
  rng.fill(x.data(), n);
  self_cond.setZero();
  const auto times = time_grid(steps, 0.05);
  std::vector<float> noise(n);
  for (int i = 0; i < steps; ++i) {
    Tensor1<float> t(B);
    t.setConstant(static_cast<float>(times[i]));
    const Tensor3<float> x0 = model.denoiser.forward(ctx, x, t, self_cond);
    const bool last = i + 1 == steps;
    if (!last) rng.fill(noise.data(), n);
    euler_step<float>(SamplerKind::sde, TangentSchedule{}, times[i], times[i + 1], x0.data(),
                      last ? nullptr : noise.data(), n, x.data());
    self_cond = x0;
  }
  for (Index i = 0; i < n; ++i) ASSERT_EQ(z.data()[i], x.data()[i]) << "element " << i;
}

// Noise groups (SamplerOptions::noise_groups): a batch of two requests, of 1 and 2
// sequences with their own seeds, gives each request the latents it gets alone, for a
// deterministic solver, a stochastic one (ξ drawn every step) and RePaint's resampling
// (fresh noise inside a step), with known tokens. One thread, so that the products split
// alike; the rows of a product do not depend on the other rows, so the latents are equal
// bit for bit.
TEST(Sampler, NoiseGroupsGiveEachRequestItsSoloLatents) {
  // Known tokens need the encoders too: every module, generated.
  struct FullModel {
    LDLM<float> model{small_config()};
    FullModel() { init_parameters(model, 7); }
  };
  static const FullModel generated;
  const LDLM<float>& full = generated.model;
  const Pipeline<float> pipeline(full);
  Context ctx(1);
  const Index T = 6;
  const Config& c = full.config;
  for (const SamplerKind kind : {SamplerKind::ode, SamplerKind::dpmpp_2m_sde}) {
    for (const int resample : {0, 1}) {
      SamplerOptions batch = options(0, kind, 4);
      batch.noise_groups = {{1, 5}, {2, 8}};
      ConditionOptions condition;
      condition.resample = resample;
      TokenTensor ids(3, T), first_ids(1, T), second_ids(2, T);
      for (TokenTensor* t : {&ids, &first_ids, &second_ids}) {
        t->setConstant(mask_id(c));
        for (Index b = 0; b < t->dimension(0); ++b) (*t)(b, 0) = 7;
      }
      const Tensor3<float> together = pipeline.sample(ctx, ids, batch, condition);
      const Tensor3<float> first = pipeline.sample(ctx, first_ids, options(5, kind, 4), condition);
      const Tensor3<float> second = pipeline.sample(ctx, second_ids, options(8, kind, 4), condition);
      const Index per_row = T * c.d_model;
      EXPECT_TRUE(std::equal(first.data(), first.data() + per_row, together.data()))
          << "request 0, solver " << static_cast<int>(kind) << ", resample " << resample;
      EXPECT_TRUE(std::equal(second.data(), second.data() + 2 * per_row, together.data() + per_row))
          << "request 1, solver " << static_cast<int>(kind) << ", resample " << resample;
      // Planted bug: the batch drawn from one seed gives request 1 other latents.
      const Tensor3<float> one_seed = pipeline.sample(ctx, ids, options(5, kind, 4), condition);
      EXPECT_FALSE(std::equal(second.data(), second.data() + 2 * per_row, one_seed.data() + per_row));
    }
  }
  SamplerOptions wrong = options(0);
  wrong.noise_groups = {{1, 5}, {1, 8}};
  EXPECT_THAT(test::error_of<InvalidArgument>([&] { pipeline.sample(ctx, 3, T, wrong); }),
              HasSubstr("the noise groups cover 2 sequences, the batch has B = 3"));
}

TEST(Sampler, ProgressSeesEveryStepAndCanCancel) {
  const Pipeline<float> pipeline(small_model());
  Context ctx(1);
  std::vector<std::pair<int, int>> seen;
  SamplerOptions o = options(1, SamplerKind::sde, 5);
  o.progress = [&](const SamplingProgress& p) {
    seen.emplace_back(p.step, p.steps);
    EXPECT_EQ(p.denoiser_calls, p.step);
    EXPECT_EQ(p.total_calls, 5);
    return true;
  };
  GenerationStats stats;
  pipeline.generate(ctx, 1, 4, o, &stats);
  EXPECT_EQ(seen, (std::vector<std::pair<int, int>>{{1, 5}, {2, 5}, {3, 5}, {4, 5}, {5, 5}}));
  EXPECT_EQ(stats.steps, 5);
  EXPECT_EQ(stats.denoiser_calls, 5);

  int calls = 0;
  o.progress = [&](const SamplingProgress& p) {
    ++calls;
    return p.step < 2;
  };
  try {
    pipeline.generate(ctx, 1, 4, o);
    FAIL() << "cancellation ignored";
  } catch (const SamplingCancelled& e) {
    EXPECT_THAT(e.what(), HasSubstr("cancelled by the progress callback after step 2 of 5"));
  }
  EXPECT_EQ(calls, 2);
  // The context stays usable after a cancelled run.
  o.progress = nullptr;
  EXPECT_EQ(shape_of(pipeline.generate(ctx, 1, 4, o)), (Shape{1, 4}));
}

TEST(Sampler, RejectsInvalidArguments) {
  const Pipeline<float> pipeline(small_model());
  Context ctx(1);
  auto expect_invalid = [&](Index B, Index T, int steps, const std::string& message) {
    try {
      pipeline.generate(ctx, B, T, options(1, SamplerKind::sde, steps));
      ADD_FAILURE() << "accepted B=" << B << " T=" << T << " steps=" << steps;
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr(message));
    }
  };
  expect_invalid(0, 4, 3, "generate: batch size B must be >= 1, got 0");
  expect_invalid(1, 0, 3, "generate: length T must be in [1, max_positions = 48], got 0");
  expect_invalid(1, 49, 3, "generate: length T must be in [1, max_positions = 48], got 49");
  expect_invalid(1, 4, 0, "generate: steps must be >= 1, got 0");
  try {
    sample_latents(ctx, small_model().denoiser, 1, 4, options(1, SamplerKind::ode, -3));
    FAIL() << "steps = -3 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("sample: steps must be >= 1, got -3"));
  }
  Config flat = small_config();
  flat.schedule_d = 0;  // σ = 0 everywhere: the score would divide by zero
  const Denoiser<float> flat_denoiser(flat);
  try {
    sample_latents(ctx, flat_denoiser, 1, 4, options(1));
    FAIL() << "schedule_d = 0 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("config 'schedule_d' must be > 0"));
  }
}

TEST(Sampler, UninitialisedDenoiserIsAClearError) {
  const LDLM<float> model(small_config());
  const Pipeline<float> pipeline(model);
  Context ctx(1);
  try {
    pipeline.generate(ctx, 1, 4, options(1));
    FAIL() << "ran without parameters";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("before it was loaded or initialised"));
  }
}

// Every buffer of a sampling step comes from the context's arena: ldlm's own code
// allocates nothing per step. oneDNN keeps a little bookkeeping per product call
// (its argument map: a few hundred bytes), so with that backend small allocations
// remain; none may be the size of an activation, and with Eigen there are none.
TEST(Sampler, NoHeapAllocationOfActivationsInsideTheSamplingLoop) {
  const LDLM<float>& model = small_model();
  Context ctx(2);  // workers too
  const Index B = 2, T = 12;
  Tensor3<float> z(B, T, 64);
  long during_loop = -1;
  std::size_t largest = 0;
  SamplerOptions o = options(5, SamplerKind::sde, 6);
  // Steps 2..N: counting starts after step 1 (which may grow the arena on a cold
  // context) and stops after the last step.
  o.progress = [&](const SamplingProgress& p) {
    const int step = p.step, total = p.steps;
    if (step == 1) {
      g_allocations = 0;
      g_largest_allocation = 0;
      g_count_allocations = true;
    }
    if (step == total) {
      g_count_allocations = false;
      during_loop = g_allocations.load();
      largest = g_largest_allocation.load();
    }
    return true;
  };
  sample_latents(ctx, model.denoiser, B, T, o, as_matrix(z));
  const std::size_t capacity = ctx.arena().capacity();
  sample_latents(ctx, model.denoiser, B, T, o, as_matrix(z));
  EXPECT_EQ(ctx.arena().capacity(), capacity) << "a warm arena must not grow";
  // The smallest activation here, one [T, d] row block, is 3 KB.
  EXPECT_LT(largest, std::size_t(1024)) << during_loop << " allocations inside the sampling loop";
  if (gemm_backend() == GemmBackend::eigen) {
    EXPECT_EQ(during_loop, 0) << "operator new called inside the sampling loop";
  }
  ::testing::Test::RecordProperty("allocations_in_loop",
                                  std::to_string(during_loop) + ", largest " + std::to_string(largest) + " bytes");

  // The counter must be live, or the checks above prove nothing.
  g_allocations = 0;
  g_count_allocations = true;
  auto* probe = new std::vector<int>(3);
  g_count_allocations = false;
  delete probe;
  if (g_allocations.load() == 0) GTEST_SKIP() << "another operator new replacement is active; count not observable";
}

}  // namespace
}  // namespace unit_sampling_sampler
}  // namespace ldlm
