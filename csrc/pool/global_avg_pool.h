// Global average pooling (custom kernels): (N, C, H, W) or (N, H, W, C) -> (N, C), the mean over H * W
// accumulated in fp32 and stored in the input's dtype; and its backward, dx[n, c, h, w] = dy[n, c] / (H * W).
#pragma once

#include <cuda_runtime_api.h>

#include "../core/tensor.h"

namespace rn {

// x: 4-D activation in `layout`; y: (N, C), same dtype.
void global_avg_pool_forward(const TensorView& x, const TensorView& y, Layout layout, cudaStream_t stream);
// dy: (N, C); dx: the 4-D activation shape in `layout`, same dtype.
void global_avg_pool_backward(const TensorView& dy, const TensorView& dx, Layout layout, cudaStream_t stream);

}  // namespace rn
