// The probe's plain C++ view of one compiled CUTLASS convolution: no CUTLASS types cross this header, so each
// instantiation lives in its own translation unit (compiled in parallel, its compile time measured alone) and
// probe.cu only sees this interface. The same split is what a csrc/ kernel layer would use.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

namespace probe {

// One forward convolution, NHWC activations, KRSC filters, square padding and stride, no dilation.
struct ConvShape {
  int n, h, w, c;  // input
  int k, r, s;     // filters
  int pad, stride;
  int p() const { return (h + 2 * pad - r) / stride + 1; }
  int q() const { return (w + 2 * pad - s) / stride + 1; }
  double macs() const { return double(n) * p() * q() * k * double(c) * r * s; }
};

enum class DType { S8, F16 };

// y = cvt(relu(alpha[k] * acc + bias[k] + beta * residual)) with the float math in fp32; cvt rounds to nearest
// (ties to even) and saturates. For kernels without a residual input, residual must be null and beta is unused.
struct ConvCall {
  const void* x = nullptr;         // n,h,w,c   (int8 or half)
  const void* w = nullptr;         // k,r,s,c   (int8 or half)
  const void* residual = nullptr;  // n,p,q,k   (same dtype as y), or null
  void* y = nullptr;               // n,p,q,k
  const float* alpha = nullptr;    // [k] per-output-channel scale (s_x*s_w[k]/s_y)
  const float* bias = nullptr;     // [k] (b[k]/s_y)
  float beta = 0.f;                // residual scale (s_r/s_y)
};

class ConvKernel {
 public:
  virtual ~ConvKernel() = default;
  virtual std::string name() const = 0;
  virtual DType dtype() const = 0;
  virtual bool has_residual() const = 0;
  virtual std::string describe() const = 0;  // tile, cluster, stages, smem bytes (JSON object body)
  // Builds the launch parameters (TMA descriptors) for this call; "" on success, else why not.
  virtual std::string prepare(const ConvShape& shape, const ConvCall& call, cudaStream_t stream) = 0;
  // Launches the prepared call.
  virtual cudaError_t launch(cudaStream_t stream) = 0;
};

// One factory per instantiation (inst_*.cu); kernels() lists those compiled in (instances.cpp, written by build.sh).
using KernelFactory = std::unique_ptr<ConvKernel> (*)();
std::vector<KernelFactory> kernels();

}  // namespace probe
