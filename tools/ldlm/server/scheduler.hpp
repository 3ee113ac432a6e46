// ldlm serve: the bounded queue of sampling requests and the worker that runs them in
// batches. Requests with the same batch key (sequence length, sampler, steps, schedule,
// precision, method, resample) that wait together run as one TextModel::sample_batch
// call, up to --max-batch sequences; each gets the samples it would get alone (its own
// seed's noise, docs/server.md §Batching).
//
// The collection window: clients that send their next request when their answer comes
// back (the usual load) return a few milliseconds after their batch ends. Taken at once,
// the next batch would hold only those that waited during the last one, and the others
// would wait for the batch after: two half batches in turn. So after a batch, while fewer
// sequences wait than are known to be about (the batch's own, whose clients were just
// answered, and those that waited), the worker waits for them, at most --batch-window-ms
// from the batch's end. A lone client is not delayed (its own request is all that is
// expected), nor is a request that finds the server idle for longer than the window.
//
// Cancellation: a batch runs to its end for every request in it; a request whose client
// went away (Job::abandon) or whose --timeout passed has its result dropped, and a batch
// left with no request waiting for it is cancelled after the current step
// (TextOptions::cancel).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ldlm/text_model.hpp"
#include "metrics.hpp"
#include "request.hpp"

namespace ldlm::server {

using Clock = std::chrono::steady_clock;

/// What requests must share to run in one batch.
struct BatchKey {
  std::size_t length = 0;
  std::string sampler, schedule, method, precision;
  int steps = 0, resample = 0;

  bool operator==(const BatchKey&) const = default;
};

/// One sampling request, from its arrival to its answer. The route that made it waits on
/// it; the worker fills it.
class Job {
 public:
  Job(BatchKey key, TextRequest request, Clock::duration timeout)
      : key(std::move(key)), request(std::move(request)), arrived(Clock::now()), deadline(arrived + timeout) {}

  const BatchKey key;
  const TextRequest request;
  const Clock::time_point arrived, deadline;
  /// Set for a streamed request: the payload of one step's event, from the step and this
  /// request's rows of it (ids and texts). Runs on the worker thread.
  std::function<std::string(const TextStep& step, std::span<const TokenIds> ids, std::span<const std::string> texts)>
      format_step;

  /// What the batch gave this request: its samples, or the error to answer with.
  struct Outcome {
    std::optional<TextSamples> samples;
    std::optional<ApiError> error;
    TextTimings timings;
    int batch_sequences = 0, batch_requests = 0;
    double queue_ms = 0;
  };

  /// The client went away: the result is dropped.
  void abandon() { abandoned_ = true; }
  bool abandoned() const { return abandoned_; }

  /// Waits until the outcome is set or `until`; then takes the step events queued so
  /// far. Returns the outcome once set.
  std::optional<Outcome> wait(Clock::time_point until, std::vector<std::string>& events) {
    std::unique_lock lock(mutex_);
    cv_.wait_until(lock, until, [&] { return outcome_.has_value() || !events_.empty(); });
    events.assign(events_.begin(), events_.end());
    events_.clear();
    if (outcome_ && events.empty()) return outcome_;
    return std::nullopt;
  }

  /// Waits for the outcome alone (a request that is not streamed).
  std::optional<Outcome> wait_outcome(Clock::time_point until) {
    std::unique_lock lock(mutex_);
    cv_.wait_until(lock, until, [&] { return outcome_.has_value(); });
    return outcome_;
  }

  bool finished() const {
    const std::lock_guard lock(mutex_);
    return outcome_.has_value();
  }

  void push_event(std::string event) {
    {
      const std::lock_guard lock(mutex_);
      if (outcome_) return;
      events_.push_back(std::move(event));
    }
    cv_.notify_all();
  }

  /// Sets the outcome once; a later call changes nothing. Returns whether it was set.
  bool finish(Outcome outcome) {
    {
      const std::lock_guard lock(mutex_);
      if (outcome_) return false;
      outcome_ = std::move(outcome);
    }
    cv_.notify_all();
    return true;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::string> events_;
  std::optional<Outcome> outcome_;
  std::atomic<bool> abandoned_{false};
};

struct SchedulerOptions {
  int max_batch = 16;                 // sequences per batch
  int max_queue = 64;                 // requests waiting
  int threads = 0;                    // of each batch's execution context; 0: every core
  Clock::duration batch_window = {};  // the collection window after a batch; 0: none
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, Metrics& metrics) : options_(options), metrics_(metrics) {}
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;
  ~Scheduler() { stop(); }

  /// Starts the worker on `model`, which must outlive the scheduler's stop().
  void start(const TextModel& model) {
    model_ = &model;
    worker_ = std::thread([this] { work(); });
  }

  /// Queues a job; throws ApiError 429 when the queue is full, 503 once stopping.
  void submit(std::shared_ptr<Job> job) {
    {
      const std::lock_guard lock(mutex_);
      if (stopping_) throw ApiError(503, "unavailable", "the server is shutting down");
      if (queue_.size() >= static_cast<std::size_t>(options_.max_queue))
        throw ApiError(
            429, "rate_limit_error",
            "the queue is full (--max-queue " + std::to_string(options_.max_queue) + " requests waiting); retry later");
      queue_.push_back(std::move(job));
    }
    cv_.notify_all();
  }

  /// Runs what is queued, then ends the worker.
  void stop() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  std::size_t queue_depth() const {
    const std::lock_guard lock(mutex_);
    return queue_.size();
  }
  std::size_t running() const { return running_; }

 private:
  /// The next batch: the oldest job and the compatible ones behind it, up to max_batch
  /// sequences. Jobs past their deadline or abandoned are answered and left out.
  std::vector<std::shared_ptr<Job>> take_batch(std::unique_lock<std::mutex>& lock) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (options_.batch_window > Clock::duration::zero()) {
      const auto gathered = [&] { return stopping_ || sequences_like_oldest() >= expected_sequences_; };
      if (!gathered()) {
        const Clock::time_point waited_from = Clock::now();
        cv_.wait_until(lock, last_batch_end_ + options_.batch_window, gathered);
        metrics_.window_waited(std::chrono::duration<double>(Clock::now() - waited_from).count());
      }
    }
    std::vector<std::shared_ptr<Job>> batch;
    int sequences = 0;
    const Clock::time_point now = Clock::now();
    for (auto it = queue_.begin(); it != queue_.end();) {
      const std::shared_ptr<Job>& job = *it;
      if (job->abandoned() || now >= job->deadline) {
        drop(*job, now);
        it = queue_.erase(it);
        continue;
      }
      if ((batch.empty() || job->key == batch.front()->key) && sequences + job->request.n <= options_.max_batch) {
        sequences += job->request.n;
        batch.push_back(job);
        it = queue_.erase(it);
        continue;
      }
      ++it;
    }
    return batch;
  }

  /// The sequences waiting that could join the oldest job's batch (itself included).
  int sequences_like_oldest() const {
    int sequences = 0;
    for (const auto& job : queue_)
      if (job->key == queue_.front()->key) sequences += job->request.n;
    return sequences;
  }

  int queued_sequences() const {
    int sequences = 0;
    for (const auto& job : queue_) sequences += job->request.n;
    return sequences;
  }

  /// Answers a job that will not run: 504 past its deadline; nothing for an abandoned one.
  void drop(Job& job, Clock::time_point now) {
    if (job.abandoned()) {
      metrics_.cancelled();
      job.finish({std::nullopt, ApiError(499, "cancelled", "the client went away"), {}, 0, 0, 0});
    } else if (now >= job.deadline) {
      metrics_.timed_out();
      job.finish({std::nullopt, timeout_error(), {}, 0, 0, 0});
    }
  }

  static ApiError timeout_error() {
    return ApiError(504, "timeout", "the request took longer than --timeout and was given up");
  }

  void work() {
    std::unique_lock lock(mutex_);
    while (true) {
      std::vector<std::shared_ptr<Job>> batch = take_batch(lock);
      if (batch.empty()) {
        if (stopping_ && queue_.empty()) return;
        continue;
      }
      lock.unlock();
      run(batch);
      lock.lock();
    }
  }

  void run(const std::vector<std::shared_ptr<Job>>& batch) {
    const BatchKey& key = batch.front()->key;
    std::vector<TextRequest> requests;
    std::vector<std::size_t> first_row;
    std::size_t rows = 0;
    bool streamed = false;
    for (const auto& job : batch) {
      requests.push_back(job->request);
      first_row.push_back(rows);
      rows += static_cast<std::size_t>(job->request.n);
      streamed = streamed || static_cast<bool>(job->format_step);
    }
    running_ = batch.size();
    const Clock::time_point started = Clock::now();
    // A job past its deadline is answered at once, and one abandoned is dropped: the
    // batch goes on for the others, and stops when none is left.
    const auto settle = [&] {
      const Clock::time_point now = Clock::now();
      bool anyone_waiting = false;
      for (const auto& job : batch) {
        if (job->finished()) continue;
        if (job->abandoned() || now >= job->deadline) {
          drop(*job, now);
          continue;
        }
        anyone_waiting = true;
      }
      return anyone_waiting;
    };
    TextTimings timings;
    TextOptions options;
    options.sampler = key.sampler;
    options.schedule = key.schedule;
    options.method = key.method;
    options.precision = key.precision;
    options.steps = key.steps;
    options.resample = key.resample;
    options.threads = options_.threads;
    options.timings = &timings;
    options.cancel = [&] { return !settle(); };
    if (streamed)
      options.on_step = [&](const TextStep& step) {
        for (std::size_t i = 0; i < batch.size(); ++i) {
          Job& job = *batch[i];
          if (!job.format_step || job.finished()) continue;
          const std::size_t n = static_cast<std::size_t>(job.request.n);
          job.push_event(job.format_step(step, step.ids.subspan(first_row[i], n), step.texts.subspan(first_row[i], n)));
        }
        return settle();
      };
    std::vector<TextSamples> samples;
    std::optional<ApiError> error;
    try {
      samples = model_->sample_batch(requests, options);
    } catch (const SamplingCancelled&) {
      // Every job has been answered by settle().
    } catch (const InvalidArgument& e) {
      error = ApiError(400, "invalid_request_error", e.what());
    } catch (const std::exception& e) {
      error = ApiError(500, "server_error", e.what());
    }
    {
      // Before any answer goes out: a client answered may send its next request at once,
      // and that one must count as expected, not as waiting besides.
      const std::lock_guard lock(mutex_);
      last_batch_end_ = Clock::now();
      expected_sequences_ = std::min(options_.max_batch, static_cast<int>(rows) + queued_sequences());
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      Job& job = *batch[i];
      Job::Outcome outcome;
      outcome.timings = timings;
      outcome.batch_sequences = static_cast<int>(rows);
      outcome.batch_requests = static_cast<int>(batch.size());
      outcome.queue_ms = std::chrono::duration<double, std::milli>(started - job.arrived).count();
      if (error)
        outcome.error = *error;
      else if (i < samples.size())
        outcome.samples = std::move(samples[i]);
      else  // cancelled: settle() has answered every job, and finish() changes nothing
        outcome.error = ApiError(503, "unavailable", "the batch was cancelled");
      if (job.abandoned()) {
        if (!job.finished()) metrics_.cancelled();
        job.finish({std::nullopt, ApiError(499, "cancelled", "the client went away"), {}, 0, 0, 0});
        continue;
      }
      job.finish(std::move(outcome));
    }
    metrics_.batch_done(static_cast<int>(rows), static_cast<int>(batch.size()), timings.denoiser_calls,
                        std::chrono::duration<double>(Clock::now() - started).count());
    running_ = 0;
  }

  SchedulerOptions options_;
  Metrics& metrics_;
  const TextModel* model_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  // The collection window's: when the last batch ended, and the sequences then known to
  // be about (its own and those waiting), at most max_batch.
  Clock::time_point last_batch_end_{};
  int expected_sequences_ = 0;
  std::atomic<std::size_t> running_{0};
  std::thread worker_;
};

}  // namespace ldlm::server
