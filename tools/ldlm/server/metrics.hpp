// ldlm serve: the counters of GET /metrics, in Prometheus' text format (version 0.0.4):
// requests by endpoint and status, the queue depth, the batch sizes, denoiser calls, the
// worker's time in batches and in collection windows, cancelled and timed-out requests,
// and the latency of requests.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

namespace ldlm::server {

/// A cumulative histogram with fixed upper bounds (Prometheus' `le`).
template <std::size_t N>
struct Histogram {
  std::array<double, N> bounds;
  std::array<std::uint64_t, N> counts{};
  std::uint64_t count = 0;
  double sum = 0;

  void observe(double value) {
    for (std::size_t i = 0; i < N; ++i)
      if (value <= bounds[i]) ++counts[i];
    ++count;
    sum += value;
  }

  void write(std::ostringstream& out, const std::string& name) const {
    for (std::size_t i = 0; i < N; ++i) out << name << "_bucket{le=\"" << bounds[i] << "\"} " << counts[i] << "\n";
    out << name << "_bucket{le=\"+Inf\"} " << count << "\n" << name << "_sum " << sum << "\n";
    out << name << "_count " << count << "\n";
  }
};

class Metrics {
 public:
  void request_done(const std::string& endpoint, int status, double seconds) {
    const std::lock_guard lock(mutex_);
    ++requests_[{endpoint, status}];
    latency_.observe(seconds);
  }

  void batch_done(int sequences, int requests, int denoiser_calls, double seconds) {
    const std::lock_guard lock(mutex_);
    batch_sequences_.observe(sequences);
    batch_requests_.observe(requests);
    denoiser_calls_ += static_cast<std::uint64_t>(denoiser_calls);
    batch_seconds_ += seconds;
  }

  void window_waited(double seconds) {
    const std::lock_guard lock(mutex_);
    window_seconds_ += seconds;
  }

  void cancelled() {
    const std::lock_guard lock(mutex_);
    ++cancelled_;
  }

  void timed_out() {
    const std::lock_guard lock(mutex_);
    ++timed_out_;
  }

  /// The Prometheus text; `queue_depth` and `running` are read by the caller.
  std::string text(std::size_t queue_depth, std::size_t running) const {
    const std::lock_guard lock(mutex_);
    std::ostringstream out;
    out << "# HELP ldlm_requests_total HTTP requests answered, by endpoint and status.\n"
           "# TYPE ldlm_requests_total counter\n";
    for (const auto& [key, count] : requests_)
      out << "ldlm_requests_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} " << count << "\n";
    out << "# HELP ldlm_queue_depth Sampling requests waiting for a batch.\n# TYPE ldlm_queue_depth gauge\n"
        << "ldlm_queue_depth " << queue_depth << "\n";
    out << "# HELP ldlm_running_requests Sampling requests in the running batch.\n"
           "# TYPE ldlm_running_requests gauge\n"
        << "ldlm_running_requests " << running << "\n";
    out << "# HELP ldlm_batch_size Sequences per sampling batch.\n# TYPE ldlm_batch_size histogram\n";
    batch_sequences_.write(out, "ldlm_batch_size");
    out << "# HELP ldlm_batch_requests Requests per sampling batch.\n# TYPE ldlm_batch_requests histogram\n";
    batch_requests_.write(out, "ldlm_batch_requests");
    out << "# HELP ldlm_denoiser_calls_total Denoiser calls of the batches that ran to their end, each over the "
           "batch.\n"
           "# TYPE ldlm_denoiser_calls_total counter\n"
        << "ldlm_denoiser_calls_total " << denoiser_calls_ << "\n";
    out << "# HELP ldlm_batch_seconds_total Time the worker spent running batches.\n"
           "# TYPE ldlm_batch_seconds_total counter\n"
        << "ldlm_batch_seconds_total " << batch_seconds_ << "\n";
    out << "# HELP ldlm_batch_window_seconds_total Time the worker waited in collection windows (--batch-window-ms) "
           "for requests known to be about.\n"
           "# TYPE ldlm_batch_window_seconds_total counter\n"
        << "ldlm_batch_window_seconds_total " << window_seconds_ << "\n";
    out << "# HELP ldlm_requests_cancelled_total Sampling requests whose client went away.\n"
           "# TYPE ldlm_requests_cancelled_total counter\n"
        << "ldlm_requests_cancelled_total " << cancelled_ << "\n";
    out << "# HELP ldlm_requests_timed_out_total Sampling requests past --timeout.\n"
           "# TYPE ldlm_requests_timed_out_total counter\n"
        << "ldlm_requests_timed_out_total " << timed_out_ << "\n";
    out << "# HELP ldlm_request_duration_seconds Time from a request's arrival to its answer.\n"
           "# TYPE ldlm_request_duration_seconds histogram\n";
    latency_.write(out, "ldlm_request_duration_seconds");
    return out.str();
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, std::uint64_t> requests_;
  Histogram<8> batch_sequences_{{1, 2, 4, 8, 16, 32, 64, 128}};
  Histogram<8> batch_requests_{{1, 2, 4, 8, 16, 32, 64, 128}};
  Histogram<12> latency_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  std::uint64_t denoiser_calls_ = 0, cancelled_ = 0, timed_out_ = 0;
  double batch_seconds_ = 0, window_seconds_ = 0;
};

}  // namespace ldlm::server
