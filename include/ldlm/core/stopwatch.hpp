// Wall time of the stages of a run (Pipeline's GenerationStats, the CLI's timing summary).
#pragma once

#include <chrono>

namespace ldlm {

/// Seconds since the start or the last lap, on the steady clock.
class Stopwatch {
 public:
  /// Seconds since the last lap (or the start), and a new lap from now.
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return seconds;
  }
  /// Seconds since the start.
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

}  // namespace ldlm
