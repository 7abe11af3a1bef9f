#include "legacy_int8_probe.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <vector>

#include "../core/cuda_event.h"
#include "../core/descriptor.h"
#include "../core/device.h"
#include "../core/error.h"

namespace rn {
namespace {

// Device bytes owned for the probe's duration.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) {
    if (bytes > 0) RN_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    if (bytes > 0) RN_CUDA_CHECK(cudaMemset(ptr_, 0, bytes));
  }
  ~DeviceBytes() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

std::string status_text(cudnnStatus_t status, const char* call) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  return std::string(call) + ": " + cudnnGetErrorString(status) + (last[0] ? std::string(" (") + last + ")" : "");
}

}  // namespace

Int8x32Probe probe_int8x32(int n, int c, int h, int w, int k, int r, int stride, int pad, bool int8_out, int runs) {
  Int8x32Probe result;
  cudnnHandle_t handle = cudnn_handle(nullptr);
  TensorDescriptor x, y, bias;
  FilterDescriptor filter;
  ConvolutionDescriptor conv;
  ActivationDescriptor relu;
  auto fail = [&](cudnnStatus_t status, const char* call) {
    result.error = status_text(status, call);
    return result;
  };
  cudnnStatus_t s = cudnnSetTensor4dDescriptor(x.get(), CUDNN_TENSOR_NCHW_VECT_C, CUDNN_DATA_INT8x32, n, c, h, w);
  if (s != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnSetTensor4dDescriptor(x, INT8x32)");
  s = cudnnSetFilter4dDescriptor(filter.get(), CUDNN_DATA_INT8x32, CUDNN_TENSOR_NCHW_VECT_C, k, c, r, r);
  if (s != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnSetFilter4dDescriptor(INT8x32)");
  s = cudnnSetConvolution2dDescriptor(conv.get(), pad, pad, stride, stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                      CUDNN_DATA_INT32);
  if (s != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnSetConvolution2dDescriptor(INT32)");
  cudnnSetConvolutionMathType(conv.get(), CUDNN_TENSOR_OP_MATH);
  int on = 0, oc = 0, oh = 0, ow = 0;
  s = cudnnGetConvolution2dForwardOutputDim(conv.get(), x.get(), filter.get(), &on, &oc, &oh, &ow);
  if (s != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnGetConvolution2dForwardOutputDim");
  s = int8_out ? cudnnSetTensor4dDescriptor(y.get(), CUDNN_TENSOR_NCHW_VECT_C, CUDNN_DATA_INT8x32, on, oc, oh, ow)
               : cudnnSetTensor4dDescriptor(y.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, on, oc, oh, ow);
  if (s != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnSetTensor4dDescriptor(y)");
  s = cudnnSetTensor4dDescriptor(bias.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, oc, 1, 1);
  if (s != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnSetTensor4dDescriptor(bias)");
  s = cudnnSetActivationDescriptor(relu.get(), CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0);
  if (s != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnSetActivationDescriptor");
  const auto algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t workspace_bytes = 0;
  s = cudnnGetConvolutionForwardWorkspaceSize(handle, x.get(), filter.get(), conv.get(), y.get(), algo,
                                              &workspace_bytes);
  if (s != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnGetConvolutionForwardWorkspaceSize");
  const size_t y_bytes = size_t(on) * oc * oh * ow * (int8_out ? 1 : 4);
  DeviceBytes xd(size_t(n) * c * h * w), wd(size_t(k) * c * r * r), yd(y_bytes), bd(size_t(oc) * 4),
      ws(workspace_bytes);
  const float alpha1 = 1.0f, alpha2 = 0.0f;
  auto call = [&] {
    return cudnnConvolutionBiasActivationForward(handle, &alpha1, x.get(), xd.get(), filter.get(), wd.get(), conv.get(),
                                                 algo, ws.get(), workspace_bytes, &alpha2, y.get(), yd.get(),
                                                 bias.get(), bd.get(), relu.get(), y.get(), yd.get());
  };
  s = call();
  if (s != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnConvolutionBiasActivationForward");
  RN_CUDA_CHECK(cudaDeviceSynchronize());
  const std::optional<float> ms = median_time_ms(nullptr, runs, [&] { return call() == CUDNN_STATUS_SUCCESS; });
  result.supported = ms.has_value();
  result.ms = ms.value_or(-1.0f);
  result.workspace = static_cast<int64_t>(workspace_bytes);
  if (!ms) result.error = "a timed call failed";
  return result;
}

}  // namespace rn
