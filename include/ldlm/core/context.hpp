// Execution context: the caller-owned thread pool and scratch arena that every
// forward pass takes explicitly. There is no global state: two threads that run
// forward at once on one const model each bring their own Context.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>
#include <vector>

#include "ldlm/core/error.hpp"
#include "ldlm/core/memory.hpp"
#include "ldlm/core/tensor.hpp"

namespace ldlm {

/// A fixed set of worker threads. parallel_for hands tasks [0, n) to the workers
/// and the calling thread, and returns when all are done. One caller at a time:
/// concurrent parallel_for calls on one pool are serialised. A task that throws
/// (a shape error, bad_alloc in a GEMM) stops the job: tasks not yet started are
/// skipped, and the first exception is rethrown to the caller once no worker
/// touches the job any more; the pool stays usable.
class ThreadPool {
 public:
  explicit ThreadPool(int threads = 1) : size_(threads) {
    if (threads < 1) throw InvalidArgument("ThreadPool: thread count must be >= 1, got " + std::to_string(threads));
    for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
  }
  ~ThreadPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  /// Calls body(task, worker) for every task in [0, n); worker is in [0, size()).
  /// Tasks must write disjoint outputs; results then do not depend on scheduling.
  /// If a task throws, the remaining tasks may be skipped and the first exception
  /// is rethrown here after every worker has left `body`.
  template <class F>
  void parallel_for(Index n, F&& body) {
    if (n <= 0) return;
    if (size_ == 1 || n == 1) {
      for (Index i = 0; i < n; ++i) body(i, 0);
      return;
    }
    std::lock_guard caller(call_mutex_);
    using Body = std::remove_reference_t<F>;
    job_.fn = [](void* ctx, Index task, int worker) { (*static_cast<Body*>(ctx))(task, worker); };
    job_.ctx = const_cast<void*>(static_cast<const void*>(&body));
    job_.n = n;
    next_.store(0, std::memory_order_relaxed);
    {
      std::lock_guard lock(mutex_);
      busy_workers_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    run_tasks(0);
    std::exception_ptr error;
    {
      // Always wait, also after a failure on this thread: the workers may still be
      // inside body, which lives in the caller's frame.
      std::unique_lock lock(mutex_);
      done_.wait(lock, [this] { return busy_workers_ == 0; });
      std::swap(error, error_);
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  struct Job {
    void (*fn)(void*, Index, int) = nullptr;
    void* ctx = nullptr;
    Index n = 0;
  };

  /// Runs tasks until none is left. Never throws: the first exception of the job is
  /// kept for the caller, and the tasks not yet handed out are skipped.
  void run_tasks(int worker) noexcept {
    try {
      for (Index i = next_.fetch_add(1, std::memory_order_relaxed); i < job_.n;
           i = next_.fetch_add(1, std::memory_order_relaxed))
        job_.fn(job_.ctx, i, worker);
    } catch (...) {
      next_.store(job_.n, std::memory_order_relaxed);
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void worker_loop(int worker) {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      run_tasks(worker);
      std::lock_guard lock(mutex_);
      if (--busy_workers_ == 0) done_.notify_one();
    }
  }

  int size_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  int busy_workers_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;  // the job's first exception, guarded by mutex_
  Job job_;
  std::atomic<Index> next_{0};
};

/// Scratch memory reused across layers and sampling steps. Allocation is a pointer
/// bump inside blocks; a Scope gives back everything allocated since it opened.
/// After a pass that needed several blocks, they are merged into one: a repeated pass
/// of the same shapes then allocates nothing, and a different pass (the token
/// decoder's logit block after the denoiser's calls) finds room in pages already
/// resident instead of a block of its own. The merged block is fresh memory, so the
/// pass right after a merge faults its pages in once; from the next one on, a pass
/// of the same shapes touches no fresh page. (Keeping the blocks unmerged spared
/// that pass its faults but cost generate's peak RSS 22 MB at T 1024:
/// bench/results/README.md, "the arena's second call".)
class Arena {
 public:
  class Scope {
   public:
    explicit Scope(Arena& arena) : arena_(arena), block_(arena.current_), offset_(arena.offset_) { ++arena.depth_; }
    ~Scope() {
      arena_.current_ = block_;
      arena_.offset_ = offset_;
      // Merge blocks only once the arena is empty again: memory handed out while no
      // Scope was open lives on and must not be freed.
      if (--arena_.depth_ == 0 && block_ == 0 && offset_ == 0) arena_.coalesce();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Arena& arena_;
    std::size_t block_, offset_;
  };

  /// Uninitialised, 64-byte aligned storage for n values of T, valid until the
  /// innermost open Scope closes.
  template <class T>
  T* allocate(std::size_t n) {
    const std::size_t bytes = rounded_bytes(n, sizeof(T));
    while (current_ < blocks_.size() && offset_ + bytes > blocks_[current_].size()) {
      ++current_;
      offset_ = 0;
    }
    if (current_ == blocks_.size()) {
      const std::size_t last = blocks_.empty() ? 0 : blocks_.back().size();
      blocks_.push_back(Block(std::max(bytes, last <= SIZE_MAX / 2 ? 2 * last : 0)));
      offset_ = 0;
    }
    std::byte* p = blocks_[current_].data() + offset_;
    offset_ += bytes;
    return reinterpret_cast<T*>(p);
  }

  std::size_t capacity() const {
    std::size_t c = 0;
    for (const auto& b : blocks_) c += b.size();
    return c;
  }

 private:
  static constexpr std::size_t kAlign = AlignedBytes::kAlign;

  /// n · size rounded up to kAlign. A count computed from negative or huge extents
  /// (an Index converted to size_t) is an error here, not a short block.
  static std::size_t rounded_bytes(std::size_t n, std::size_t size) {
    const auto bytes = checked_product<std::size_t>({n, size});
    if (!bytes || *bytes > SIZE_MAX - (kAlign - 1))
      throw InvalidArgument("Arena::allocate: " + std::to_string(n) + " values of " + std::to_string(size) +
                            " bytes exceed the address space");
    return (*bytes + kAlign - 1) / kAlign * kAlign;
  }

  // A block from 1 MB up has pages of its own: when blocks merge, the sampler's blocks
  // go back to the system before decoding faults in the merged one.
  using Block = AlignedBytes;

  void coalesce() {
    if (blocks_.size() > 1) {
      const std::size_t total = capacity();
      blocks_.clear();
      blocks_.push_back(Block(total));
    }
    current_ = 0;
    offset_ = 0;
  }

  std::vector<Block> blocks_;
  std::size_t current_ = 0, offset_ = 0;
  int depth_ = 0;
};

/// What a forward pass runs with. Cheap to create; one per calling thread.
class Context {
 public:
  /// Owns a pool of `threads` threads (1 = run on the calling thread only).
  explicit Context(int threads = 1) : owned_(std::make_unique<ThreadPool>(threads)), pool_(owned_.get()) {
    make_worker_arenas();
  }
  /// Uses a caller-owned pool, which must outlive the context.
  explicit Context(ThreadPool& pool) : pool_(&pool) { make_worker_arenas(); }

  ThreadPool& pool() { return *pool_; }
  int threads() const { return pool_->size(); }
  /// The calling thread's scratch, for buffers that outlive a parallel_for.
  Arena& arena() { return arena_; }
  /// The scratch of one parallel_for worker (the `worker` its tasks are given),
  /// for buffers that live inside a task. Each worker's arena is its own allocation:
  /// two workers' attention tiles carved from one shared block ran slower than
  /// tiles in arenas of their own (bench/results/README.md). A task should ask for
  /// what the largest task of its call needs, so that every worker's arena is sized by the first task it runs.
  Arena& worker_arena(int worker) {
    if (worker < 0 || worker >= threads())
      throw InvalidArgument("Context::worker_arena: worker " + std::to_string(worker) + " of a pool of " +
                            std::to_string(threads()) + " threads");
    return *worker_arenas_[static_cast<std::size_t>(worker)];
  }

  /// When set, modules check their outputs for NaN/Inf and throw NumericError.
  bool check_finite = false;

  /// When set, modules hand it their residual stream at every block boundary
  /// (llm.c-style intermediate values), named as in the reference's block dumps:
  /// module "denoiser", name "blocks.0" (tests/data/README.md). Called on the calling
  /// thread with a copy in double, row form [B*T, width] (the denoiser's "condition":
  /// [B, d]). Unset (the default), it costs one test per block and copies nothing.
  std::function<void(std::string_view module, std::string_view name, const Matrix<double>& value)> block_observer;

 private:
  void make_worker_arenas() {
    for (int w = 0; w < pool_->size(); ++w) worker_arenas_.push_back(std::make_unique<Arena>());
  }

  std::unique_ptr<ThreadPool> owned_;
  ThreadPool* pool_;
  Arena arena_;
  std::vector<std::unique_ptr<Arena>> worker_arenas_;  // one per pool thread; blocks allocated on first use
};

/// Hands out execution contexts, one per call at a time, and keeps them for the next
/// call: a context's thread pool and scratch arenas cost a thread start and page faults
/// to build. Calls from several threads each lease a context of their own.
class ContextPool {
 public:
  class Lease {
   public:
    Lease(ContextPool& pool, std::unique_ptr<Context> ctx) : pool_(pool), ctx_(std::move(ctx)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { pool_.give_back(std::move(ctx_)); }
    Context& operator*() { return *ctx_; }

   private:
    ContextPool& pool_;
    std::unique_ptr<Context> ctx_;
  };

  Lease take(int threads) {
    {
      const std::lock_guard lock(mutex_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if ((*it)->threads() == threads) {
          std::unique_ptr<Context> ctx = std::move(*it);
          idle_.erase(it);
          return Lease(*this, std::move(ctx));
        }
    }
    return Lease(*this, std::make_unique<Context>(threads));
  }

 private:
  static constexpr std::size_t kMaxIdle = 8;

  void give_back(std::unique_ptr<Context> ctx) {
    const std::lock_guard lock(mutex_);
    if (idle_.size() < kMaxIdle) idle_.push_back(std::move(ctx));
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<Context>> idle_;
};

/// Runs f(row) for every row in [0, rows), in chunks of rows over the context's
/// threads: the loop of every row-wise op. f must only write its own row.
template <class F>
void for_each_row(Context& ctx, Index rows, F&& f) {
  constexpr Index kRowsPerTask = 32;
  const Index tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  ctx.pool().parallel_for(tasks, [&](Index task, int) {
    const Index end = std::min(rows, (task + 1) * kRowsPerTask);
    for (Index r = task * kRowsPerTask; r < end; ++r) f(r);
  });
}

}  // namespace ldlm
