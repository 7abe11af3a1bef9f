// A measurement, not an op: does cuDNN's legacy API run an INT8x32 (NCHW_VECT_C) convolution with bias and ReLU
// fused (cudnnConvolutionBiasActivationForward, IMPLICIT_PRECOMP_GEMM, int32 accumulation) on this GPU, and how
// fast. The quantised engines use the graph API (quantized_conv); tools/probe_quantized.py times this legacy
// path beside it on the same shapes, which is how a user would choose between them. It allocates its own device
// buffers (zeros: the speed of these kernels does not depend on the values) and synchronises.
#pragma once

#include <cstdint>
#include <string>

namespace rn {

struct Int8x32Probe {
  bool supported = false;
  std::string error;  // the cuDNN status and message when not supported
  float ms = -1.0f;   // median of `runs` calls between CUDA events
  int64_t workspace = 0;
};

// x (n, c, h, w) and w (k, c, r, r) in INT8x32 (c and k multiples of 32), stride / pad on both axes; y in INT8x32
// (int8_out) or fp32 NCHW.
Int8x32Probe probe_int8x32(int n, int c, int h, int w, int k, int r, int stride, int pad, bool int8_out, int runs);

}  // namespace rn
