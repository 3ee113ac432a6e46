// Reliability: determinism across runs and thread counts, concurrent forward
// passes on one shared const model, the optional NaN/Inf check, and API-boundary
// validation not covered by test_model.cpp (B = 0, T = max_positions + 1 for the
// encoder and token decoder, thread counts, rank mismatches, invalid configs).
//
// The model is model_small (tests/data/model_small/config.json) with weights from
// init_parameters(model, 3); the inputs are the model_small reference inputs
// (B = 2, T = 37), so every module runs on realistic activations.
//
// ReliabilityConcurrent.* is what the tsan preset runs (ctest -R Concurrent); the
// ReliabilityConcurrentThrows.* cases drive ThreadPool::parallel_for with tasks
// that throw on workers and on the calling thread, hundreds of times over.
//
// 1 vs 2 threads: each op splits its work into tasks with disjoint outputs, but
// the split changes the shapes of the sub-products and so their summation order:
// the results are not bitwise equal. They must agree within the float32 tolerance,
// 1e-5 absolute + 1e-5 relative; the test records the largest differences as
// properties (--gtest_output=xml). At a fixed thread count the results are bitwise
// stable.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <latch>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ldlm/io/state_dict.hpp"
#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"

namespace {

using namespace ldlm;
using ldlm::test::bitwise_equal;
using ldlm::test::data_path;
using ldlm::test::error_of;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr Tolerance kAcrossThreadCounts{1e-5, 1e-5};

const Config& small_config() {
  static const Config c = Config::load(data_path("model_small/config.json"));
  return c;
}

LDLM<float> make_small_model() {
  LDLM<float> m(small_config());
  init_parameters(m, 3);
  return m;
}

/// Shared by every test here, and by the concurrent readers: never modified.
const LDLM<float>& small_model() {
  static const LDLM<float> m = make_small_model();
  return m;
}

struct Inputs {
  TokenTensor tokens;
  Tensor3<float> features, latents, hidden, x_t, self_cond;
  Tensor1<float> t;
};

const Inputs& small_inputs() {
  static const Inputs in = [] {
    Inputs i;
    i.tokens = read_tensor<std::int64_t, 2>(open_reference("model_small/feature_model.inputs.safetensors"), "tokens");
    i.features = read_tensor<float, 3>(open_reference("model_small/encoder.inputs.safetensors"), "features");
    i.latents = read_tensor<float, 3>(open_reference("model_small/latent_decoder.inputs.safetensors"), "latents");
    i.hidden = read_tensor<float, 3>(open_reference("model_small/token_decoder.inputs.safetensors"), "hidden");
    const auto den = open_reference("model_small/denoiser.inputs.safetensors");
    i.x_t = read_tensor<float, 3>(den, "x_t");
    i.self_cond = read_tensor<float, 3>(den, "self_cond");
    i.t = read_tensor<float, 1>(den, "t");
    return i;
  }();
  return in;
}

/// One forward of every module, each on its own reference input.
struct Outputs {
  Tensor3<float> features, latents, hidden, logits, x0;
};

Outputs run_all(const LDLM<float>& m, const Inputs& in, Context& ctx) {
  Outputs out;
  out.features = m.feature_model.forward(ctx, in.tokens);
  out.latents = m.encoder.forward(ctx, in.features);
  out.hidden = m.latent_decoder.forward(ctx, in.latents);
  out.logits = m.token_decoder.forward(ctx, in.hidden);
  out.x0 = m.denoiser.forward(ctx, in.x_t, in.t, in.self_cond);
  return out;
}

template <class F>
void for_each_output(const Outputs& a, const Outputs& b, F&& f) {
  f("features", a.features, b.features);
  f("latents", a.latents, b.latents);
  f("hidden", a.hidden, b.hidden);
  f("logits", a.logits, b.logits);
  f("x0", a.x0, b.x0);
}

void expect_bitwise_equal(const Outputs& got, const Outputs& want, const std::string& label) {
  for_each_output(got, want, [&](const char* name, const Tensor3<float>& a, const Tensor3<float>& b) {
    EXPECT_TRUE(bitwise_equal(label + " " + name, a, b));
  });
}

// ---------------------------------------------------------------------------
// 1. Determinism
// ---------------------------------------------------------------------------

TEST(ReliabilityDeterminism, RepeatedRunsAreBitwiseIdentical) {
  const auto& m = small_model();
  const auto& in = small_inputs();
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " thread(s)");
    // The second run reuses the first one's arena, whose blocks now hold stale
    // values: a kernel reading scratch it did not write would show up here.
    Context ctx(threads);
    const Outputs first = run_all(m, in, ctx);
    const Outputs second = run_all(m, in, ctx);
    Context fresh(threads);
    const Outputs third = run_all(m, in, fresh);
    expect_bitwise_equal(second, first, "same context, second run:");
    expect_bitwise_equal(third, first, "fresh context:");
  }
}

TEST(ReliabilityDeterminism, OneAndTwoThreadsAgree) {
  const auto& m = small_model();
  const auto& in = small_inputs();
  Context one(1), two(2);
  const Outputs a = run_all(m, in, one), b = run_all(m, in, two);
  for_each_output(b, a, [&](const char* name, const Tensor3<float>& got, const Tensor3<float>& want) {
    std::ostringstream observed;
    observed << ldlm::test::max_abs_diff(got, want);
    ::testing::Test::RecordProperty(std::string(name) + ".max_abs_diff_1_vs_2_threads", observed.str());
    EXPECT_TRUE(ldlm::test::all_close(name, got.data(), want.data(), shape_of(want), kAcrossThreadCounts));
  });
}

// ---------------------------------------------------------------------------
// 2. Concurrency: one shared const model, one Context per calling thread
// ---------------------------------------------------------------------------

TEST(ReliabilityConcurrent, FourThreadsShareOneConstModel) {
  const LDLM<float>& m = small_model();
  const auto& in = small_inputs();
  // References computed alone, per thread count (each caller's Context owns 1 or 2 threads).
  Context ref1(1), ref2(2);
  const Outputs reference[2] = {run_all(m, in, ref1), run_all(m, in, ref2)};

  constexpr int kCallers = 4, kRounds = 3;
  std::latch start(kCallers);
  std::vector<std::vector<Outputs>> results(kCallers);
  std::vector<std::string> errors(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      try {
        Context ctx(1 + c % 2);
        start.arrive_and_wait();  // all callers inside forward at the same time
        for (int r = 0; r < kRounds; ++r) results[std::size_t(c)].push_back(run_all(m, in, ctx));
      } catch (const std::exception& e) {
        errors[std::size_t(c)] = e.what();
      }
    });
  }
  for (auto& t : callers) t.join();

  for (int c = 0; c < kCallers; ++c) {
    SCOPED_TRACE("caller " + std::to_string(c) + " with " + std::to_string(1 + c % 2) + " thread(s)");
    EXPECT_EQ(errors[std::size_t(c)], "");
    ASSERT_EQ(results[std::size_t(c)].size(), std::size_t(errors[std::size_t(c)].empty() ? kRounds : 0));
    for (int r = 0; r < kRounds; ++r)
      expect_bitwise_equal(results[std::size_t(c)][std::size_t(r)], reference[c % 2],
                           "round " + std::to_string(r) + ":");
  }
}

TEST(ReliabilityConcurrent, ContextsSharingOnePoolAreSerialised) {
  // Context(ThreadPool&) lets callers share workers; the pool serialises their
  // parallel_for calls, so two callers on one pool still get exact results.
  const LDLM<float>& m = small_model();
  const auto& in = small_inputs();
  ThreadPool pool(2);
  Context alone(pool);
  const Outputs reference = run_all(m, in, alone);

  constexpr int kCallers = 2;
  std::latch start(kCallers);
  std::vector<Outputs> results(kCallers);
  std::vector<std::string> errors(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      try {
        Context ctx(pool);
        start.arrive_and_wait();
        results[std::size_t(c)] = run_all(m, in, ctx);
      } catch (const std::exception& e) {
        errors[std::size_t(c)] = e.what();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    SCOPED_TRACE("caller " + std::to_string(c));
    EXPECT_EQ(errors[std::size_t(c)], "");
    if (errors[std::size_t(c)].empty()) expect_bitwise_equal(results[std::size_t(c)], reference, "shared pool:");
  }
}

// ---------------------------------------------------------------------------
// 2b. Exceptions inside parallel_for: the first one reaches the caller only after
//     every worker has left the job, and the pool works normally afterwards
// ---------------------------------------------------------------------------

constexpr int kThrowingRounds = 300;

/// Spins (yielding) until pred() holds.
template <class P>
void wait_until(P&& pred) {
  while (!pred()) std::this_thread::yield();
}

/// A normal job after a failed one: every task runs exactly once, and parallel_for
/// returns only after all of them (a wrong busy-worker count would return early).
void expect_pool_works(ThreadPool& pool, const std::string& after) {
  constexpr Index n = 97;
  std::vector<std::atomic<int>> runs(n);
  std::atomic<int> finished{0};
  pool.parallel_for(n, [&](Index task, int worker) {
    EXPECT_GE(worker, 0);
    EXPECT_LT(worker, pool.size());
    runs[std::size_t(task)].fetch_add(1);
    finished.fetch_add(1);
  });
  EXPECT_EQ(finished.load(), n) << "parallel_for returned before all tasks finished, " << after;
  for (Index i = 0; i < n; ++i) ASSERT_EQ(runs[std::size_t(i)].load(), 1) << "task " << i << ", " << after;
}

TEST(ReliabilityConcurrentThrows, WorkerExceptionReachesTheCaller) {
  ThreadPool pool(3);
  for (int round = 0; round < kThrowingRounds; ++round) {
    std::atomic<bool> worker_inside{false};
    std::atomic<int> in_flight{0};
    const std::string message = error_of<ShapeError>([&] {
      pool.parallel_for(64, [&](Index task, int worker) {
        in_flight.fetch_add(1);
        if (worker == 0) {
          // The caller's task holds on until a worker has taken one, so the
          // exception really comes from a worker thread.
          wait_until([&] { return worker_inside.load(); });
        } else {
          worker_inside.store(true);
          in_flight.fetch_sub(1);
          throw ShapeError("task " + std::to_string(task) + " failed on worker " + std::to_string(worker));
        }
        in_flight.fetch_sub(1);
      });
    });
    ASSERT_THAT(message, AllOf(HasSubstr("failed on worker "), ::testing::Not(HasSubstr("worker 0"))))
        << "round " << round;
    ASSERT_EQ(in_flight.load(), 0) << "a task was still running when the exception arrived, round " << round;
    expect_pool_works(pool, "round " + std::to_string(round));
  }
}

/// Runs a job whose calling-thread task throws while both workers are still inside
/// body, writing into `slots`, a local of this frame: if parallel_for let the
/// exception out before the workers were done, they would write into freed memory
/// (AddressSanitizer) and `in_flight` would not be 0 at the catch.
void throw_on_the_caller_while_workers_run(ThreadPool& pool, std::atomic<int>& in_flight) {
  std::vector<int> slots(64, 0);
  std::atomic<bool> caller_threw{false};
  pool.parallel_for(64, [&](Index task, int worker) {
    if (worker == 0) {
      wait_until([&] { return in_flight.load() == pool.size() - 1; });
      caller_threw.store(true);
      throw InvalidArgument("caller task " + std::to_string(task) + " failed");
    }
    in_flight.fetch_add(1);
    wait_until([&] { return caller_threw.load(); });
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    slots[std::size_t(task)] = worker;  // still touching the caller's frame
    in_flight.fetch_sub(1);
  });
}

TEST(ReliabilityConcurrentThrows, CallerExceptionWaitsForTheWorkers) {
  ThreadPool pool(3);
  for (int round = 0; round < kThrowingRounds; ++round) {
    std::atomic<int> in_flight{0};
    const std::string message =
        error_of<InvalidArgument>([&] { throw_on_the_caller_while_workers_run(pool, in_flight); });
    ASSERT_THAT(message, HasSubstr("caller task ")) << "round " << round;
    ASSERT_EQ(in_flight.load(), 0) << "workers were still inside the job when the exception arrived, round " << round;
    expect_pool_works(pool, "round " + std::to_string(round));
  }
}

TEST(ReliabilityConcurrentThrows, EveryTaskThrowingGivesOneExceptionAndSkipsTheRest) {
  ThreadPool pool(2);
  for (int round = 0; round < kThrowingRounds; ++round) {
    std::atomic<int> started{0};
    const std::string message = error_of<Error>([&] {
      pool.parallel_for(1000, [&](Index task, int) {
        started.fetch_add(1);
        throw Error("task " + std::to_string(task));
      });
    });
    ASSERT_THAT(message, HasSubstr("task ")) << "round " << round;
    // Each thread stops at its first failure: at most one task per thread ran.
    ASSERT_LE(started.load(), pool.size()) << "round " << round;
    expect_pool_works(pool, "round " + std::to_string(round));
  }
}

TEST(ReliabilityConcurrentThrows, OpThatThrowsInATaskLeavesTheContextUsable) {
  // A real op: linear's epilogue runs inside the pool's tasks, on both threads.
  Context ctx(2);
  const Matrix<float> x = Matrix<float>::Random(256, 24), w = Matrix<float>::Random(40, 24);
  const Matrix<float> want = x * w.transpose();
  Matrix<float> y(256, 40);
  for (int round = 0; round < kThrowingRounds / 3; ++round) {
    std::atomic<int> blocks{0};
    EXPECT_THAT(error_of<NumericError>([&] {
                  linear<float>(ctx, x, w, nullptr, y, WeightLayout::out_in, [&](MatRef<float>) {
                    if (blocks.fetch_add(1) == round % 2) throw NumericError("epilogue: block rejected");
                  });
                }),
                HasSubstr("epilogue: block rejected"));
    y.setZero();
    linear<float>(ctx, x, w, nullptr, y);
    ASSERT_LT((y - want).cwiseAbs().maxCoeff(), 1e-4f) << "round " << round;
  }
}

TEST(ReliabilityConcurrentThrows, OneThreadPoolPassesTheExceptionThrough) {
  ThreadPool pool(1);
  int ran = 0;
  EXPECT_THAT(error_of<ShapeError>([&] {
                pool.parallel_for(5, [&](Index task, int) {
                  ++ran;
                  if (task == 2) throw ShapeError("task 2");
                });
              }),
              HasSubstr("task 2"));
  EXPECT_EQ(ran, 3);
  expect_pool_works(pool, "after the one-thread failure");
}

// ---------------------------------------------------------------------------
// 3. The optional NaN/Inf check (Context::check_finite)
// ---------------------------------------------------------------------------

TEST(ReliabilityFiniteCheck, NonFiniteWeightThrowsOnlyWhenChecking) {
  struct Case {
    const char* parameter;  // poisoned with a NaN or an Inf
    float value;
    const char* module;  // what the error must name
    const char* tensor;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {"feature_model.h.0.ln_1.weight", nan, "feature_model", "features"},
      {"encoder.output_norm.gamma", nan, "encoder", "latents"},
      {"latent_decoder.mask_vector", inf, "latent_decoder", "hidden"},
      {"token_decoder.lm_head.weight", nan, "token_decoder", "logits"},
      {"denoiser.output_layer.linear.bias", nan, "denoiser", "x0"},
  };
  const auto& in = small_inputs();
  for (const Case& k : cases) {
    SCOPED_TRACE(k.parameter);
    LDLM<float> m(small_config());
    init_parameters(m, 3, "", /*pack=*/std::nullopt);
    bool poisoned = false;
    m.visit("", [&](const std::string& name, auto& p) {
      if (name == k.parameter) p.data()[0] = k.value, poisoned = true;
    });
    ASSERT_TRUE(poisoned) << "no parameter named " << k.parameter;
    pack_parameters(m, Precision::fp32);

    auto forward = [&](Context& ctx) -> Tensor3<float> {
      const std::string module = k.module;
      if (module == "feature_model") return m.feature_model.forward(ctx, in.tokens);
      if (module == "encoder") return m.encoder.forward(ctx, in.features);
      if (module == "latent_decoder") return m.latent_decoder.forward(ctx, in.latents);
      if (module == "token_decoder") return m.token_decoder.forward(ctx, in.hidden);
      return m.denoiser.forward(ctx, in.x_t, in.t, in.self_cond);
    };

    Context checking;
    checking.check_finite = true;
    EXPECT_THAT(error_of<NumericError>([&] { forward(checking); }),
                AllOf(HasSubstr(std::string(k.module) + ": non-finite value"),
                      HasSubstr(std::string("'") + k.tensor + "'"), HasSubstr("at row ")));

    // Off (the default): no check, no throw; the non-finite value reaches the output.
    Context unchecked;
    Tensor3<float> out;
    EXPECT_NO_THROW(out = forward(unchecked));
    bool non_finite = false;
    for (Index i = 0; i < out.size(); ++i) non_finite = non_finite || !std::isfinite(out.data()[i]);
    EXPECT_TRUE(non_finite) << "the poisoned weight did not reach '" << k.tensor << "'; the case tests nothing";
  }
}

TEST(ReliabilityFiniteCheck, FiniteModelPassesTheCheck) {
  Context ctx;
  ctx.check_finite = true;
  Context plain;
  expect_bitwise_equal(run_all(small_model(), small_inputs(), ctx), run_all(small_model(), small_inputs(), plain),
                       "check_finite on vs off:");
}

// ---------------------------------------------------------------------------
// 4. API-boundary validation (test_model.cpp covers token ids, T = 0 / T = 49 for
//    the feature model, encoder, latent decoder and denoiser, feature widths,
//    self_cond and t; these are the remaining cases)
// ---------------------------------------------------------------------------

TEST(ReliabilityInputs, EmptyBatchIsRejectedByEveryModule) {
  const auto& m = small_model();
  Context ctx;
  Tensor3<float> empty(0, 5, 64);
  Tensor1<float> no_t(0);
  EXPECT_THAT(error_of<ShapeError>([&] { m.feature_model.forward(ctx, TokenTensor(0, 5)); }),
              AllOf(HasSubstr("feature_model: tensor 'tokens' has shape [0, 5]"), HasSubstr("need B >= 1")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.encoder.forward(ctx, empty); }),
              AllOf(HasSubstr("encoder: tensor 'features' has shape [0, 5, 64]"), HasSubstr("need B >= 1")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.latent_decoder.forward(ctx, empty); }),
              AllOf(HasSubstr("latent_decoder: tensor 'latents' has shape [0, 5, 64]"), HasSubstr("need B >= 1")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.token_decoder.forward(ctx, empty); }),
              AllOf(HasSubstr("token_decoder: tensor 'hidden' has shape [0, 5, 64]"), HasSubstr("need B >= 1")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.denoiser.forward(ctx, empty, no_t, empty); }),
              AllOf(HasSubstr("denoiser: tensor 'x_t' has shape [0, 5, 64]"), HasSubstr("need B >= 1")));
}

TEST(ReliabilityInputs, OnePastMaxPositionsForEncoderAndTokenDecoder) {
  const auto& m = small_model();
  Context ctx;
  const Index T = small_config().max_positions + 1;
  Tensor3<float> too_long(1, T, 64);
  too_long.setZero();
  EXPECT_THAT(
      error_of<ShapeError>([&] { m.encoder.forward(ctx, too_long); }),
      AllOf(HasSubstr("encoder: tensor 'features' has shape [1, 49, 64]"), HasSubstr("1 <= T <= max_positions = 48")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.token_decoder.forward(ctx, too_long); }),
              AllOf(HasSubstr("token_decoder: tensor 'hidden' has shape [1, 49, 64]"),
                    HasSubstr("1 <= T <= max_positions = 48")));
  // T = max_positions itself is fine.
  Tensor3<float> longest(1, T - 1, 64);
  longest.setZero();
  EXPECT_NO_THROW(m.encoder.forward(ctx, longest));
  EXPECT_NO_THROW(m.token_decoder.forward(ctx, longest));
}

TEST(ReliabilityInputs, DenoiserInputWidth) {
  const auto& m = small_model();
  Context ctx;
  Tensor3<float> wide(2, 5, 65), x(2, 5, 64);
  wide.setZero();
  x.setZero();
  Tensor1<float> t(2);
  t.setConstant(0.5f);
  EXPECT_THAT(error_of<ShapeError>([&] { m.denoiser.forward(ctx, wide, t, x); }),
              HasSubstr("denoiser: tensor 'x_t' expected shape [*, *, 64], got [2, 5, 65]"));
  EXPECT_THAT(error_of<ShapeError>([&] { m.denoiser.forward(ctx, x, t, wide); }),
              HasSubstr("denoiser: tensor 'self_cond' expected shape [2, 5, 64], got [2, 5, 65]"));
}

TEST(ReliabilityInputs, ThreadCountMustBePositive) {
  EXPECT_THAT(error_of<InvalidArgument>([] { ThreadPool pool(0); }),
              HasSubstr("ThreadPool: thread count must be >= 1, got 0"));
  EXPECT_THAT(error_of<InvalidArgument>([] { Context ctx(-1); }),
              HasSubstr("ThreadPool: thread count must be >= 1, got -1"));
  EXPECT_THAT(error_of<InvalidArgument>([] { Context ctx(0); }), HasSubstr("got 0"));
}

TEST(ReliabilityInputs, WorkerArenasBelongToTheirWorkers) {
  ThreadPool pool(2);
  Context ctx(pool);
  EXPECT_THAT(error_of<InvalidArgument>([&] { ctx.worker_arena(2); }),
              HasSubstr("Context::worker_arena: worker 2 of a pool of 2 threads"));
  EXPECT_THAT(error_of<InvalidArgument>([&] { ctx.worker_arena(-1); }), HasSubstr("worker -1"));

  // Two tasks that wait for each other run at once, on both workers. Each fills scratch
  // from its worker's arena; a buffer shared between them would end up with one
  // pattern in both.
  constexpr std::size_t kBytes = 1 << 16;
  std::latch filled(2), checked(2);
  std::array<std::thread::id, 2> thread_of{};
  std::array<std::ptrdiff_t, 2> own_bytes{};
  pool.parallel_for(2, [&](Index, int worker) {
    Arena& arena = ctx.worker_arena(worker);
    Arena::Scope scope(arena);
    std::byte* p = arena.allocate<std::byte>(kBytes);
    const auto pattern = std::byte{static_cast<unsigned char>(worker + 1)};
    std::fill_n(p, kBytes, pattern);
    thread_of[static_cast<std::size_t>(worker)] = std::this_thread::get_id();
    filled.arrive_and_wait();
    own_bytes[static_cast<std::size_t>(worker)] = std::count(p, p + kBytes, pattern);
    checked.arrive_and_wait();  // neither buffer is given back before both are counted
  });
  EXPECT_EQ(own_bytes[0], static_cast<std::ptrdiff_t>(kBytes));
  EXPECT_EQ(own_bytes[1], static_cast<std::ptrdiff_t>(kBytes));
  EXPECT_NE(thread_of[0], thread_of[1]);

  // A worker index names one thread for the pool's lifetime.
  std::array<std::atomic<int>, 2> elsewhere{};
  pool.parallel_for(256, [&](Index, int worker) {
    if (std::this_thread::get_id() != thread_of[static_cast<std::size_t>(worker)]) ++elsewhere[worker];
  });
  EXPECT_EQ(elsewhere[0].load() + elsewhere[1].load(), 0);

  // Attention and packed products take their task scratch from the workers' arenas,
  // never from the caller's (which may hold the caller's own buffers meanwhile).
  Context two(2);
  const Matrix<float> qkv = Matrix<float>::Random(256, 3 * 64), x = Matrix<float>::Random(256, 64);
  Matrix<float> attended(256, 64), y(256, 96);
  attention<float>(two, {qkv.data(), 3 * 64}, {qkv.data() + 64, 3 * 64}, {qkv.data() + 128, 3 * 64}, attended.data(),
                   64, AttentionShape{1, 256, 256, 2, 32}, AttentionOptions{});
  linear(two, x, PackedMatrix::pack(Matrix<float>::Random(96, 64), WeightLayout::out_in, Precision::fp32), nullptr,
         MatRef<float>(y));
  EXPECT_EQ(two.arena().capacity(), 0u);
  EXPECT_GT(two.worker_arena(0).capacity() + two.worker_arena(1).capacity(), 0u);
}

TEST(ReliabilityInputs, RankMismatchNamesBothShapes) {
  EXPECT_THAT(error_of<ShapeError>([] {
                check_shape("op", "x", {2, 3}, Shape{2, 3, 1});
              }),
              HasSubstr("op: tensor 'x' expected shape [2, 3], got [2, 3, 1]"));
  EXPECT_THAT(error_of<ShapeError>([] {
                check_shape("op", "x", {-1, 64}, Shape{64});
              }),
              HasSubstr("op: tensor 'x' expected shape [*, 64], got [64]"));

  // A checkpoint whose weight was flattened to rank 1 (same element count).
  const fs::path dir = fs::temp_directory_path() / ("ldlm_reliability_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "flat.safetensors").string();
  SafetensorsWriter writer;
  LDLM<float> plain(small_config());
  init_parameters(plain, 3, "", /*pack=*/std::nullopt);
  visit_parameters(plain, "", [&](const std::string& name, const auto& p) {
    const Shape shape = name == "denoiser.input_proj.weight" ? Shape{p.numel()} : p.shape();
    writer.add(name, shape, p.data());
  });
  writer.write(path);
  LDLM<float> loaded(small_config());
  EXPECT_THAT(
      error_of<CheckpointError>([&] { load_parameters(loaded, SafetensorsFile::open(path)); }),
      AllOf(HasSubstr(path), HasSubstr("tensor 'denoiser.input_proj.weight' expected shape [64, 128], got [8192]")));
  fs::remove_all(dir);
}

TEST(ReliabilityInputs, InvalidConfigIsRejectedBeforeAnyModuleIsBuilt) {
  Config no_heads = small_config();
  no_heads.n_heads = 0;
  EXPECT_THAT(error_of<ConfigError>([&] { LDLM<float> m(no_heads); }),
              HasSubstr("config: 'n_heads' must be >= 1, got 0"));
  Config odd = small_config();
  odd.head_dim = 15;
  odd.n_heads = 1;
  odd.d_model = 15;
  EXPECT_THAT(error_of<ConfigError>([&] { LDLM<float> m(odd); }), HasSubstr("config: 'head_dim' must be even"));
  Config huge = small_config();
  huge.vocab_size = std::int64_t{1} << 40;
  EXPECT_THAT(error_of<ConfigError>([&] { LDLM<float> m(huge); }),
              HasSubstr("config: 'vocab_size' must be <= 4194304, got 1099511627776"));
}

// ---------------------------------------------------------------------------
// 5. Size arithmetic cannot overflow: bounded config keys, batches checked
//    against the widest row, overflow-checked products in the arena
// ---------------------------------------------------------------------------

/// ldlm-base with every bounded size key at its maximum (still a valid config).
Config largest_config() {
  Config c;
  c.d_model = 1 << 16;
  c.n_heads = 1;
  c.head_dim = 1 << 16;
  c.mlp_mult = 64;
  c.max_positions = 1 << 20;
  c.vocab_size = 1 << 22;
  c.token_decoder_mlp_hidden = 1 << 22;
  c.encoder_layers = c.latent_decoder_layers = c.token_decoder_layers = 1024;
  c.denoiser_blocks = c.gpt2_layers = c.gpt2_feature_layers = 1024;
  return c;
}

TEST(ReliabilityOverflow, ConfigSizeKeysHaveRealisticInclusiveBounds) {
  const Config largest = largest_config();
  EXPECT_NO_THROW(largest.validate());
  EXPECT_EQ(largest.widest_row(), std::int64_t{1} << 22);
  // Parameter counts of the largest model are formed without overflow.
  const ParameterCounts counts = count_parameters(largest);
  ::testing::Test::RecordProperty("largest_config.trained", std::to_string(counts.trained));
  EXPECT_GT(counts.trained, std::int64_t{1} << 50);
  EXPECT_LT(counts.trained + counts.frozen, std::int64_t{1} << 53);

  struct Bound {
    const char* key;
    std::int64_t max;
    std::int64_t Config::*field;
  };
  const Bound bounds[] = {{"d_model", 65536, &Config::d_model},
                          {"n_heads", 65536, &Config::n_heads},
                          {"head_dim", 65536, &Config::head_dim},
                          {"mlp_mult", 64, &Config::mlp_mult},
                          {"max_positions", 1048576, &Config::max_positions},
                          {"vocab_size", 4194304, &Config::vocab_size},
                          {"token_decoder_mlp_hidden", 4194304, &Config::token_decoder_mlp_hidden},
                          {"encoder_layers", 1024, &Config::encoder_layers},
                          {"denoiser_blocks", 1024, &Config::denoiser_blocks},
                          {"gpt2_layers", 1024, &Config::gpt2_layers}};
  for (const Bound& b : bounds) {
    SCOPED_TRACE(b.key);
    EXPECT_EQ(Config::max_value(b.key), b.max);
    Config over = largest;
    over.*b.field = b.max + 1;
    EXPECT_THAT(error_of<ConfigError>([&] { over.validate(); }),
                HasSubstr("config: '" + std::string(b.key) + "' must be <= " + std::to_string(b.max) + ", got " +
                          std::to_string(b.max + 1)));
  }
  // The JSON route reaches the same check.
  EXPECT_THAT(error_of<ConfigError>([] { Config::parse(R"({"max_positions": 16777216})"); }),
              HasSubstr("config: 'max_positions' must be <= 1048576, got 16777216"));
}

TEST(ReliabilityOverflow, BatchWhoseActivationsOverflowAnIndexIsRejected) {
  // The largest config: B · T · widest_row = 2^20 · 2^20 · 2^22 = 2^62 fits, twice that does not.
  const Config c = largest_config();
  const Index T = c.max_positions;
  EXPECT_NO_THROW(check_sampling_arguments("generate", c, Index{1} << 20, T, 1));
  EXPECT_THAT(error_of<InvalidArgument>([&] { check_sampling_arguments("generate", c, Index{1} << 21, T, 1); }),
              HasSubstr("generate: a batch of B = 2097152 sequences of T = 1048576 is too large: its [B, T, 4194304] "
                        "activations have more elements than a 64-bit index can count"));
  EXPECT_THAT(error_of<ShapeError>([&] { check_batch_fits("token_decoder", std::numeric_limits<Index>::max(), 1, c); }),
              HasSubstr("token_decoder: a batch of B = 9223372036854775807 sequences of T = 1 is too large"));

  // Through the public API, before any allocation: generate on model_small with an
  // absurd batch (the old check only required B >= 1).
  const Pipeline<float> pipeline(small_model());
  Context ctx;
  SamplerOptions options;
  options.steps = 1;
  EXPECT_THAT(error_of<InvalidArgument>([&] { pipeline.generate(ctx, Index{1} << 60, 48, options); }),
              HasSubstr("generate: a batch of B = 1152921504606846976 sequences of T = 48 is too large"));
  EXPECT_EQ(ctx.arena().capacity(), 0u);
}

TEST(ReliabilityOverflow, CheckedProductBoundaries) {
  constexpr Index kMax = std::numeric_limits<Index>::max();
  EXPECT_EQ(checked_product<Index>({Index{1} << 31, Index{1} << 31}), Index{1} << 62);
  EXPECT_EQ(checked_product<Index>({Index{1} << 31, Index{1} << 31, 2}), std::nullopt);
  EXPECT_EQ(checked_product<Index>({kMax, 1}), kMax);
  EXPECT_EQ(checked_product<Index>({0, kMax, kMax}), 0);
  EXPECT_EQ(checked_product<Index>({Index{1} << 32, Index{1} << 31}), std::nullopt);
  EXPECT_EQ(checked_product<Index>({kMax / 2 + 1, 2}), std::nullopt);
  EXPECT_EQ(checked_product<Index>({-1, 5}), std::nullopt);
  EXPECT_EQ(checked_product<Index>({}), 1);
  constexpr std::size_t kSizeMax = std::numeric_limits<std::size_t>::max();
  EXPECT_EQ(checked_product<std::size_t>({kSizeMax / 4, 4}), kSizeMax / 4 * 4);
  EXPECT_EQ(checked_product<std::size_t>({kSizeMax / 4 + 1, 4}), std::nullopt);
}

TEST(ReliabilityOverflow, ArenaRejectsByteCountsThatOverflow) {
  Arena arena;
  constexpr std::size_t kSizeMax = std::numeric_limits<std::size_t>::max();
  EXPECT_THAT(error_of<InvalidArgument>([&] { arena.allocate<double>(kSizeMax / 8 + 1); }),
              HasSubstr("Arena::allocate: 2305843009213693952 values of 8 bytes exceed the address space"));
  // Rounding up to the 64-byte alignment must not wrap either.
  EXPECT_THAT(error_of<InvalidArgument>([&] { arena.allocate<std::byte>(kSizeMax - 62); }),
              HasSubstr("values of 1 bytes exceed the address space"));
  // A negative Index converted to size_t (rows * d gone wrong upstream) is caught the same way.
  EXPECT_THAT(error_of<InvalidArgument>([&] { arena.allocate<float>(static_cast<std::size_t>(Index{-64})); }),
              HasSubstr("values of 4 bytes exceed the address space"));
  EXPECT_EQ(arena.capacity(), 0u);
  // Normal use afterwards.
  float* p = arena.allocate<float>(100);
  p[99] = 1.0f;
  EXPECT_GE(arena.capacity(), 400u);
}

}  // namespace
