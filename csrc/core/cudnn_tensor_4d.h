// A legacy cuDNN 4-D tensor descriptor for an activation of logical (N, C, H, W) stored in `layout`, shared by
// the batch-norm, pooling and cudnnAddTensor ops.
#pragma once

#include <array>

#include "descriptor.h"
#include "dtype.h"

namespace rn {

inline TensorDescriptor make_tensor_4d(Layout layout, DType dtype, const std::array<int, 4>& nchw) {
  TensorDescriptor desc;
  RN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc.get(), layout == Layout::NCHW ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC,
                                            cudnn_dtype(dtype), nchw[0], nchw[1], nchw[2], nchw[3]));
  return desc;
}

}  // namespace rn
