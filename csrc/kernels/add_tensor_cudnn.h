// out = a + b through cudnnAddTensor (C = alpha * A + beta * C), kept as the baseline the custom add kernel is
// benchmarked against. 4-D activations only (cuDNN needs the layout).
#pragma once

#include <cuda_runtime_api.h>

#include "../core/tensor.h"

namespace rn::kernels {

// `out` may be `a` or `b`. When it is neither, b is first copied into out (cudaMemcpyAsync), since
// cudnnAddTensor accumulates into its destination.
void add_tensor_cudnn(const TensorView& a, const TensorView& b, const TensorView& out, Layout layout,
                      cudaStream_t stream);

}  // namespace rn::kernels
