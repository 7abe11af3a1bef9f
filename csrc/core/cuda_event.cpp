#include "cuda_event.h"

namespace rn {

TimedRuns::TimedRuns(cudaStream_t stream, size_t runs) : stream_(stream), events_(runs + 1) {
  gate_.emplace(stream);
  RN_CUDA_CHECK(cudaEventRecord(events_[0].get(), stream));
}

void TimedRuns::end_run() {
  if (ended_ + 1 >= events_.size()) throw ValueError("TimedRuns: more runs ended than were announced");
  RN_CUDA_CHECK(cudaEventRecord(events_[++ended_].get(), stream_));
}

std::vector<float> TimedRuns::times_ms() {
  gate_.reset();
  RN_CUDA_CHECK(cudaEventSynchronize(events_[ended_].get()));
  std::vector<float> times(ended_);
  for (size_t i = 0; i < ended_; ++i) {
    RN_CUDA_CHECK(cudaEventElapsedTime(&times[i], events_[i].get(), events_[i + 1].get()));
  }
  return times;
}

float median_ms(std::vector<float> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace rn
