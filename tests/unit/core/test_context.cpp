// The context (core/context.hpp): its thread pool passes exceptions from workers and from
// the caller, hundreds of times over, and works normally afterwards
// (ContextConcurrentThrows.*, run under ThreadSanitizer by ctest -R Concurrent); thread
// counts; worker arenas belong to their workers; the arena refuses byte counts that overflow.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <latch>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/memory.hpp"
#include "support/reference.hpp"

namespace unit_core_context {
namespace {

using namespace ldlm;
using ldlm::test::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Exceptions inside parallel_for: the first one reaches the caller only after
// every worker has left the job, and the pool works normally afterwards
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

TEST(ContextConcurrentThrows, WorkerExceptionReachesTheCaller) {
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

TEST(ContextConcurrentThrows, CallerExceptionWaitsForTheWorkers) {
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

TEST(ContextConcurrentThrows, EveryTaskThrowingGivesOneExceptionAndSkipsTheRest) {
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

TEST(ContextConcurrentThrows, OpThatThrowsInATaskLeavesTheContextUsable) {
  // A real op: linear's epilogue runs inside the pool's tasks, on both threads.
  Context ctx(2);
  const Matrix<float> x = Matrix<float>::Random(256, 24), w = Matrix<float>::Random(40, 24);
  const Matrix<float> want = x * w.transpose();
  Matrix<float> y(256, 40);
  for (int round = 0; round < kThrowingRounds / 3; ++round) {
    std::atomic<int> blocks{0};
    EXPECT_THAT(error_of<NumericError>([&] {
                  linear<float>(ctx, x, {w, WeightLayout::out_in}, nullptr, y, [&](MatRef<float>) {
                    if (blocks.fetch_add(1) == round % 2) throw NumericError("epilogue: block rejected");
                  });
                }),
                HasSubstr("epilogue: block rejected"));
    y.setZero();
    linear<float>(ctx, x, {w, WeightLayout::out_in}, nullptr, y);
    ASSERT_LT((y - want).cwiseAbs().maxCoeff(), 1e-4f) << "round " << round;
  }
}

TEST(ContextConcurrentThrows, OneThreadPoolPassesTheExceptionThrough) {
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

TEST(Context, ThreadCountMustBePositive) {
  EXPECT_THAT(error_of<InvalidArgument>([] { ThreadPool pool(0); }),
              HasSubstr("ThreadPool: thread count must be >= 1, got 0"));
  EXPECT_THAT(error_of<InvalidArgument>([] { Context ctx(-1); }),
              HasSubstr("ThreadPool: thread count must be >= 1, got -1"));
  EXPECT_THAT(error_of<InvalidArgument>([] { Context ctx(0); }), HasSubstr("got 0"));
}

TEST(Context, WorkerArenasBelongToTheirWorkers) {
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

// A sampling loop repeats one pass of the same shapes. The first pass grows the arena in
// blocks, merged into one when it ends; from the second on, a pass must land on the same
// bytes with no new block, so that from the third a step touches no fresh page.
TEST(Context, ArenaRepeatedPassReusesTheSameBytes) {
  Arena arena;
  const auto pass = [&] {
    std::vector<const void*> at;
    Arena::Scope outer(arena);
    at.push_back(arena.allocate<float>(100));
    {
      Arena::Scope inner(arena);
      at.push_back(arena.allocate<float>(5000));  // beyond the first block
      at.push_back(arena.allocate<double>(70000));
    }
    at.push_back(arena.allocate<std::byte>(300000));
    return at;
  };
  pass();
  const std::size_t capacity = arena.capacity();
  const std::vector<const void*> second = pass();
  EXPECT_EQ(arena.capacity(), capacity);
  for (int call = 3; call <= 4; ++call) {
    EXPECT_EQ(pass(), second) << "call " << call;
    EXPECT_EQ(arena.capacity(), capacity) << "call " << call;
  }
}

// When a pass's blocks merge, the old blocks must go back to the system before the next
// pass faults in the merged one: the sampler's blocks stayed resident through decoding
// while they came from glibc's heap (docs/performance.md §int8, "Memory").
TEST(Context, ArenaMergedBlocksGoBackToTheSystem) {
  ldlm::test::raise_malloc_mmap_threshold();
  Arena arena;
  std::vector<const std::byte*> first_pass;
  {
    Arena::Scope pass(arena);
    for (int i = 0; i < 3; ++i) {
      std::byte* b = arena.allocate<std::byte>(std::size_t(3) << 20);  // a block each
      std::memset(b, 1, std::size_t(3) << 20);
      first_pass.push_back(b + (std::size_t(3) << 19));
    }
  }
  ASSERT_GE(arena.capacity(), std::size_t(9) << 20);
  for (std::size_t i = 0; i < first_pass.size(); ++i)
    EXPECT_FALSE(ldlm::test::page_resident(first_pass[i])) << "block " << i << " of the merged pass is still resident";
}

TEST(Context, ArenaRejectsByteCountsThatOverflow) {
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
}  // namespace unit_core_context
