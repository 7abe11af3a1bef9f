// The residual-block elementwise kernels: add (b optionally scaled), add + ReLU, ReLU, scale, and the ReLU-mask
// backward shared by ReLU and add + ReLU. Any size, fp32 / fp16 / bf16 storage with fp32 math, 16-byte vector loads and
// stores when every pointer is 16-byte aligned (scalar otherwise and for the tail), grid-stride, on the caller's
// stream.
//
// The views must already be validated by the caller: same dtype and element count. `out` may be one of the
// inputs (in place): every element is read before it is written, by the same thread.
#pragma once

#include <cuda_runtime_api.h>

#include "../core/tensor.h"

namespace rn::kernels {

// out = a + b, or max(a + b, 0) with relu.
void add(const TensorView& a, const TensorView& b, const TensorView& out, bool relu, cudaStream_t stream);
// out = a + alpha * b (one rounding, the math in fp32): a weighted sum of logits without a scaled copy.
void add_scaled(const TensorView& a, const TensorView& b, float alpha, const TensorView& out, cudaStream_t stream);
// out = alpha * x.
void scale(const TensorView& x, float alpha, const TensorView& out, cudaStream_t stream);
// out = max(x, 0) (NaN propagates).
void relu(const TensorView& x, const TensorView& out, cudaStream_t stream);
// out = y > 0 ? dy : 0, with y the saved ReLU output: the gradient of relu(x), and of both summands of
// relu(a + b). Written as PyTorch's threshold_backward (y <= 0 ? 0 : dy), so an infinite dy stays infinite.
void relu_backward(const TensorView& dy, const TensorView& y, const TensorView& out, cudaStream_t stream);

}  // namespace rn::kernels
