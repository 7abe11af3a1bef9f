// The CUDA device and the cuDNN handle an op runs with. One handle per device, created on first use and
// re-bound to the caller's stream on every call (the Python side passes cupy's current stream).
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

namespace rn {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count();
// Why device_count() is 0 ("" when it is not): "no CUDA GPU or driver (<the CUDA error>)" when the runtime
// cannot use the driver, "no CUDA GPU" when the driver sees no device.
std::string device_unavailable_reason();
// The current CUDA device. Throws NoDeviceError (a clear Python RuntimeError) when there is no GPU.
int current_device();
// The current device's cuDNN handle, bound to `stream`.
cudnnHandle_t cudnn_handle(cudaStream_t stream);
// True while `stream` is being captured into a CUDA graph: nothing may allocate or synchronise then.
bool stream_is_capturing(cudaStream_t stream);
// Destroys every handle (they are re-created on next use). Handles still alive at process exit are left to
// the driver's teardown on purpose: destroying them from static destructors races the CUDA runtime's own.
void release_handles();

}  // namespace rn
