// Errors raised by the native core. Every cuDNN / CUDA status goes through RN_CUDNN_CHECK / RN_CUDA_CHECK,
// which throw a C++ exception carrying the status name, cuDNN's last error string, the failing expression,
// file:line and the shapes of the op in flight (OpContext). The bindings translate these into Python's
// resnet_native.CudnnError / CudaError (RuntimeError subclasses), TypeError and ValueError.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace rn {

// Bad argument type (CPU array, unsupported dtype): becomes Python TypeError.
class TypeError : public std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// Bad argument value (shape, layout, strides, device): becomes Python ValueError.
class ValueError : public std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// A GPU op was called on a machine without a usable CUDA device.
class NoDeviceError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

class CudnnError : public std::runtime_error {
 public:
  CudnnError(cudnnStatus_t status, std::string message) : std::runtime_error(std::move(message)), status(status) {}
  cudnnStatus_t status;
};

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, std::string message) : std::runtime_error(std::move(message)), code(code) {}
  cudaError_t code;
};

// Describes the op in flight (name and shapes) for error messages. Formatting is lazy: the text is built
// only when an error is actually raised, so the guard costs two pointer writes on the hot path.
class OpContext {
 public:
  using Describe = std::string (*)(const void* data);
  OpContext(Describe describe, const void* data);
  ~OpContext();
  OpContext(const OpContext&) = delete;
  OpContext& operator=(const OpContext&) = delete;
  // "" when no op is in flight.
  static std::string current();

 private:
  Describe describe_;
  const void* data_;
  const OpContext* outer_;
};

[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line);
[[noreturn]] void throw_cuda_error(cudaError_t code, const char* expr, const char* file, int line);

// cudnnGetErrorString + the thread's cudnnGetLastErrorString, for callers that format their own message.
std::string cudnn_status_name(cudnnStatus_t status);
std::string cudnn_last_error();

}  // namespace rn

#define RN_CUDNN_CHECK(expr)                                          \
  do {                                                                \
    const cudnnStatus_t rn_status_ = (expr);                          \
    if (rn_status_ != CUDNN_STATUS_SUCCESS) {                         \
      ::rn::throw_cudnn_error(rn_status_, #expr, __FILE__, __LINE__); \
    }                                                                 \
  } while (0)

#define RN_CUDA_CHECK(expr)                                        \
  do {                                                             \
    const cudaError_t rn_code_ = (expr);                           \
    if (rn_code_ != cudaSuccess) {                                 \
      ::rn::throw_cuda_error(rn_code_, #expr, __FILE__, __LINE__); \
    }                                                              \
  } while (0)

// After every kernel launch: catches bad launch configurations immediately. cudaGetLastError (not Peek) also
// clears a non-sticky error, so one failed launch is not reported again by every later one.
#define RN_CUDA_CHECK_LAUNCH() RN_CUDA_CHECK(cudaGetLastError())
