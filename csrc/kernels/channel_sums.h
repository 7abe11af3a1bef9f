// The per-channel sum of a 4-D array (conv2d_backward_bias: a bias's gradient), our own kernel because cuDNN's
// cudnnConvolutionBackwardBias is slow on a fully connected layer's (N, 1, 1, K) gradient.
#pragma once

#include <cuda_runtime_api.h>

#include "../core/tensor.h"

namespace rn::kernels {

// out[c] = the sum of dy over N, H and W for channel c, dy 4-D in `layout` and out of K elements, both of one
// storage dtype (validated by the caller). Summed in float64 in a fixed order, then rounded to float32 (and from
// there to fp16 or bf16): deterministic.
void channel_sums(const TensorView& dy, const TensorView& out, Layout layout, cudaStream_t stream);

}  // namespace rn::kernels
