#include "device.h"

#include <memory>
#include <mutex>
#include <vector>

#include "descriptor.h"
#include "error.h"

namespace rn {
namespace {

struct DeviceState {
  std::once_flag probed;
  int count = 0;
  std::string reason;
  std::mutex mutex;
  std::vector<std::unique_ptr<Handle>> handles;
};

DeviceState& state() {
  static DeviceState* s = new DeviceState();  // Never destroyed: see release_handles().
  std::call_once(s->probed, [] {
    const cudaError_t err = cudaGetDeviceCount(&s->count);
    if (err != cudaSuccess) {
      s->count = 0;
      s->reason = std::string("no CUDA GPU or driver (") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err) + ")";
      cudaGetLastError();  // Clear the sticky-free error so later calls start clean.
    } else if (s->count == 0) {
      s->reason = "no CUDA GPU";
    }
    s->handles.resize(s->count);
  });
  return *s;
}

}  // namespace

int device_count() {
  return state().count;
}

std::string device_unavailable_reason() {
  return state().reason;
}

int current_device() {
  if (device_count() == 0) {
    throw NoDeviceError("resnet_native: this operation needs a CUDA GPU, but none is usable (" +
                        device_unavailable_reason() + ")");
  }
  int device = 0;
  RN_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

cudnnHandle_t cudnn_handle(cudaStream_t stream) {
  const int device = current_device();
  DeviceState& s = state();
  cudnnHandle_t raw;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto& slot = s.handles[device];
    if (!slot) slot = std::make_unique<Handle>();
    raw = slot->get();
  }
  RN_CUDNN_CHECK(cudnnSetStream(raw, stream));
  return raw;
}

bool stream_is_capturing(cudaStream_t stream) {
  if (device_count() == 0) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  RN_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

void release_handles() {
  DeviceState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& h : s.handles) h.reset();
}

}  // namespace rn
