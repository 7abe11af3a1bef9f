// The geometry of a convolution problem: the one output-size formula, the layout order of shapes, and the one
// builder of a validated ConvParams from a spec and the caller's shapes (every binding that keys or runs a
// convolution goes through make_conv_params).
#pragma once

#include <array>
#include <cstdint>

#include "conv_params.h"
#include "conv_spec.h"

namespace rn {

using Dims4 = std::array<int64_t, 4>;

// (filter - 1) * dilation + 1: the input span one output position reads along a dimension.
int64_t dilated_filter_extent(int64_t filter, int64_t dilation);
// The output size along one spatial dimension: (input + 2 * pad - dilated filter extent) / stride + 1, or 0 when
// the padded input is smaller than the dilated filter. Needs stride >= 1; int32 arguments cannot overflow.
int64_t conv_output_extent(int64_t input, int64_t filter, int64_t pad, int64_t stride, int64_t dilation);

// Logical (N, C, H, W) of an activation shape given in the layout's order, and back. Filters follow the same
// order: NCHW (K, C/g, R, S), NHWC (K, R, S, C/g).
Dims4 logical_dims(const Dims4& in_layout, Layout layout);
Dims4 layout_dims(const Dims4& logical, Layout layout);

// ValueError naming `name` unless every dimension is between 1 and INT32_MAX and the element count fits 32 bits
// (cuDNN's legacy API indexes with int; the cache key stores int32 dimensions).
void check_int32_shape(const Dims4& shape, const char* name);

// The key of convolving x with w under `spec` in `direction` (device and workspace cap left 0: the caller binds
// them), after validating the problem: every dimension between 1 and INT32_MAX, channels divisible by groups
// and matching the filter, a padded input at least as large as the dilated filter, and x, w and the output each
// within 32-bit element counts. `x_shape` / `w_shape` are in spec.layout's order; errors name them by `x_name` /
// `w_name` (rn::ValueError).
ConvParams make_conv_params(ConvDirection direction, const ConvSpec& spec, const Dims4& x_shape, const Dims4& w_shape,
                            uint8_t epilogue, const char* x_name, const char* w_name);

// The output shape of a key in its layout's order.
Dims4 output_shape(const ConvParams& params);

// That a key (e.g. one parsed from an algorithm-cache file) describes a convolution: its geometry within
// ConvSpec::make's ranges, its shapes accepted by make_conv_params, and its output the one the formula gives.
// Throws rn::ValueError saying what is wrong.
void check_key_geometry(const ConvParams& params);

}  // namespace rn
