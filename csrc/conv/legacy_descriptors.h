// The legacy-API descriptors of one convolution: input, filter, output, convolution, bias and activations.
// A group is built once per (geometry, math type) and kept in a small cache, because a call would otherwise
// create and destroy six descriptors. Groups are immutable after construction (the math type is part of the
// key, not set per call), so threads may share them. drop_cached_descriptors() empties the cache; groups still
// in use by a running call are freed when that call releases them.
#pragma once

#include <array>
#include <cstddef>
#include <memory>

#include "../core/descriptor.h"
#include "conv_params.h"

namespace rn::legacy {

struct ConvDescriptors {
  // Builds every descriptor from params (precision, layout, x, w, y, pad, stride, dilation, groups). An error
  // half-way destroys the descriptors already created (each member is an RAII Descriptor).
  ConvDescriptors(const ConvParams& params, cudnnMathType_t math_type);

  TensorDescriptor x;             // input x / dx: N, C, H, W
  FilterDescriptor w;             // filter w / dw: K, C/groups, R, S
  TensorDescriptor y;             // output y / dy, and the residual z: N, K, P, Q
  ConvolutionDescriptor conv;     // pads, strides, dilations, groups, fp32 compute, `math_type`
  TensorDescriptor bias;          // 1, K, 1, 1
  ActivationDescriptor relu;      // for cudnnConvolutionBiasActivationForward / cudnnActivationForward
  ActivationDescriptor identity;  // for cudnnConvolutionBiasActivationForward without activation
  cudnnMathType_t math_type;
};

// The cached group for params (geometry fields only) and math type.
std::shared_ptr<const ConvDescriptors> descriptors(const ConvParams& params, cudnnMathType_t math_type);
// Empties the cache (the bindings' drop_cached_descriptors).
void clear_descriptor_cache();
size_t descriptor_cache_size();

// Logical (N, K, P, Q) of the output as cuDNN computes it (cudnnGetConvolution2dForwardOutputDim); needs no GPU.
// Uses params' precision, layout, x, w, pad, stride, dilation and groups.
std::array<int, 4> output_dims(const ConvParams& params);

// cudnnTensorFormat_t of a layout.
inline cudnnTensorFormat_t tensor_format(Layout layout) {
  return layout == Layout::NCHW ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
}

}  // namespace rn::legacy
