#include "launch_config.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "device.h"
#include "error.h"

namespace rn {

int sm_count() {
  static std::array<std::atomic<int>, 64> cached{};  // 0: not queried yet
  const int device = current_device();
  if (device < 0 || device >= static_cast<int>(cached.size())) {
    int count = 0;
    RN_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }
  int count = cached[device].load(std::memory_order_relaxed);
  if (count == 0) {
    RN_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    cached[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

int grid_size(int64_t work_items, int threads_per_block, int blocks_per_sm) {
  const int64_t needed = (work_items + threads_per_block - 1) / threads_per_block;
  const int64_t cap = static_cast<int64_t>(sm_count()) * blocks_per_sm;
  return static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
}

}  // namespace rn
