// A scalar operand of a kernel that may change from launch to launch without the host (a learning rate under a
// schedule, the loss scale): a float32 device scalar the kernel reads, or a value passed with the launch.
#pragma once

namespace rn::kernels {

// *ptr when ptr is set, else value.
struct ScalarArg {
  float value = 0.0f;
  const float* ptr = nullptr;
};

#ifdef __CUDACC__
__device__ __forceinline__ float read_scalar(const ScalarArg& s) {
  return s.ptr != nullptr ? *s.ptr : s.value;
}
#endif

}  // namespace rn::kernels
