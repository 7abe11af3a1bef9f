// A CUDA event (RAII) and the one way the engines time work with events: median of repeated runs, each between
// two events and waited for (so only algorithm search uses it: it synchronises).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "error.h"

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

// Runs `run()` `runs` times (at least once) on `stream`, each time between two events, and returns the median time
// in milliseconds; std::nullopt as soon as a run returns false (it could not run).
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
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace rn
