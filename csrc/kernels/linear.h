// A fully connected layer's three products, our own kernels: on a (N, C) batch with a few outputs K, cuDNN's fp32
// 1x1 convolutions cost more, and each needed a conversion of the low-precision features first (and cuBLAS through
// cupy cannot be captured in a CUDA graph).
//   forward         y[n, k]  = b[k] + sum_c x[n, c] w[k, c]
//   backward data   dx[n, c] = sum_k dy[n, k] w[k, c]
//   backward weight dw[k, c] = sum_n dy[n, k] x[n, c]
// x and dx are fp32, fp16 or bf16 (one dtype); w, b, y, dy and dw fp32. Every sum is taken in fp32 (no TF32) in a
// fixed order: deterministic. The caller validates shapes, dtypes and aliasing.
#pragma once

#include <cuda_runtime_api.h>

#include "../core/tensor.h"

namespace rn::kernels {

void linear_forward(const TensorView& x, const TensorView& w, const TensorView& b, const TensorView& y,
                    cudaStream_t stream);
void linear_backward_data(const TensorView& dy, const TensorView& w, const TensorView& dx, cudaStream_t stream);
void linear_backward_weight(const TensorView& x, const TensorView& dy, const TensorView& dw, cudaStream_t stream);

}  // namespace rn::kernels
