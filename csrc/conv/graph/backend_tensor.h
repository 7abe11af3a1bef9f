// Backend tensor descriptors for the convolution graphs. Every tensor is described by its logical NCHW
// dimensions; the memory layout (NCHW or NHWC) is expressed only through the strides, which is how the graph API
// tells the two apart.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>

#include "../../core/descriptor.h"
#include "../../core/dtype.h"

namespace rn::graph {

struct TensorSpec {
  std::array<int64_t, 4> dims{};     // logical N, C, H, W (filters: K, C/groups, R, S)
  std::array<int64_t, 4> strides{};  // in elements, for the same logical order
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  int64_t uid = 0;          // unique within one operation graph; the variant pack refers to it
  int64_t alignment = 16;   // bytes the data pointer is aligned to (virtual tensors: 16)
  bool is_virtual = false;  // an intermediate that never touches memory
};

// Strides of a C-contiguous array holding logical NCHW `dims` in `layout` (NHWC: channels innermost).
std::array<int64_t, 4> layout_strides(const std::array<int64_t, 4>& dims, Layout layout);

// Largest power of two (at most 16) dividing `address`: what a tensor descriptor may claim as its alignment.
int64_t pointer_alignment(const void* address);

// Creates and finalizes a CUDNN_BACKEND_TENSOR_DESCRIPTOR (finalizing a tensor needs no GPU).
BackendDescriptor make_tensor(const TensorSpec& spec);

}  // namespace rn::graph
