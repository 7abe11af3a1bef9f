// 2-D max pooling on cuDNN (cudnnPoolingForward / cudnnPoolingBackward), NCHW or NHWC, fp32 / fp16 / bf16.
// Padded positions never win (they act as -inf, as in PyTorch), NaN propagates, and the deterministic max mode
// is used so the backward pass gives the same gradients on every run.
#pragma once

#include <cuda_runtime_api.h>

#include <array>

#include "../core/tensor.h"

namespace rn {

struct PoolWindow {
  std::array<int, 2> kernel{}, stride{}, padding{};  // (h, w)
};

// Logical (N, C, P, Q) of the output, as cuDNN computes it (floor mode). Works without a GPU.
std::array<int, 4> max_pool2d_output_dims(const std::array<int, 4>& x_nchw, const PoolWindow& window, DType dtype,
                                          Layout layout);

// y = maxpool(x). Shapes validated by the caller against max_pool2d_output_dims.
void max_pool2d_forward(const TensorView& x, const TensorView& y, const PoolWindow& window, Layout layout,
                        cudaStream_t stream);
// dx = gradient of maxpool at x, given y = maxpool(x) and dy.
void max_pool2d_backward(const TensorView& dy, const TensorView& x, const TensorView& y, const TensorView& dx,
                         const PoolWindow& window, Layout layout, cudaStream_t stream);

}  // namespace rn
