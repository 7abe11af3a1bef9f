// A CUDA event (RAII) and the two ways the engines and the Python side time work with events, both reporting the
// median of the runs: TimedRuns (queued back to back behind a HostGate, waited for once: device time alone) and
// median_time_ms (each run waited for: the host's launch cost counts). Only searches and measurements use them.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "error.h"
#include "host_gate.h"

namespace rn {

class CudaEvent {
 public:
  CudaEvent() { RN_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~CudaEvent() { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Up to `runs` runs the caller queues on `stream`, each followed by end_run(). The gate holds the stream until
// times_ms(), so the GPU runs them back to back and the host's gaps between queuing them stay out of the times.
// Leaving without times_ms() (a run failed, an exception) opens the gate and waits for nothing.
class TimedRuns {
 public:
  TimedRuns(cudaStream_t stream, size_t runs);
  void end_run();
  // Opens the gate, waits for the last run; each ended run's milliseconds, in order.
  std::vector<float> times_ms();

 private:
  cudaStream_t stream_;
  std::optional<HostGate> gate_;
  std::vector<CudaEvent> events_;  // events_[0] before the first run, events_[i + 1] after run i
  size_t ended_ = 0;
};

// The median (the upper one of an even count); `times` must not be empty.
float median_ms(std::vector<float> times);

// Runs `run()` `runs` times (at least once) on `stream`, each alone between two events and waited for, and returns
// the median in milliseconds; std::nullopt as soon as a run returns false (it could not run). Unlike TimedRuns the
// host's cost of queuing a run counts: the auto engine chooses with it what an eager call pays.
template <class Run>
std::optional<float> median_time_ms(cudaStream_t stream, int runs, Run&& run) {
  CudaEvent start, stop;
  std::vector<float> times;
  for (int i = 0; i < std::max(runs, 1); ++i) {
    RN_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    const bool ran = run();
    RN_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    RN_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    if (!ran) return std::nullopt;
    float ms = 0.0f;
    RN_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    times.push_back(ms);
  }
  return median_ms(std::move(times));
}

}  // namespace rn
