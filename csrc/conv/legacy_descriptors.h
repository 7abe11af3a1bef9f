// The legacy-API descriptors of one convolution: input, filter, output, convolution, bias and activations.
// A group is built once per (geometry, math type) and kept in a small cache, because a call would otherwise
// create and destroy six descriptors. Groups are immutable after construction (the math type is part of the
// key, not set per call), so threads may share them. drop_cached_descriptors() empties the cache; groups still
// in use by a running call are freed when that call releases them.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <vector>

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

// The descriptor groups one call uses, by math type: each is looked up in the cache at most once per call (a
// lookup hashes the geometry and takes the cache's lock), then handed down to everything the call runs.
class DescriptorGroups {
 public:
  explicit DescriptorGroups(const ConvParams& params) : params_(params) {}
  const ConvDescriptors& get(cudnnMathType_t math_type);

 private:
  static constexpr int kMathTypes = 4;  // cudnnMathType_t: DEFAULT, TENSOR_OP, TENSOR_OP_ALLOW_CONVERSION, FMA
  const ConvParams& params_;
  std::array<std::shared_ptr<const ConvDescriptors>, kMathTypes> groups_;
  std::vector<std::shared_ptr<const ConvDescriptors>> others_;  // math types outside those (cuDNN refuses them)
};

// cudnnTensorFormat_t of a layout.
inline cudnnTensorFormat_t tensor_format(Layout layout) {
  return layout == Layout::NCHW ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
}

}  // namespace rn::legacy
