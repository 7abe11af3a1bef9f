#include "conv_geometry.h"

#include <string>

#include "../core/error.h"

namespace rn {
namespace {

std::string dims_str(const Dims4& d) {
  return "(" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) + ", " +
         std::to_string(d[3]) + ")";
}

void check_dims(const Dims4& shape, const char* name) {
  for (int64_t d : shape) {
    if (d < 1 || d > INT32_MAX) {
      throw ValueError(std::string(name) + ": every dimension must be between 1 and " + std::to_string(INT32_MAX) +
                       ", got " + dims_str(shape));
    }
  }
}

// Dimensions are at most INT32_MAX, so the product may overflow int64: multiply with a bound instead.
void check_int32_elements(const Dims4& d, const char* name) {
  int64_t n = 1;
  for (int64_t v : d) {
    if (n > INT32_MAX / v) {
      throw ValueError(std::string(name) + ": " + dims_str(d) + " has more than " + std::to_string(INT32_MAX) +
                       " elements, beyond cuDNN's 32-bit indexing of the legacy API");
    }
    n *= v;
  }
}

void copy_dims(int32_t* out, const Dims4& d) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<int32_t>(d[i]);
}

}  // namespace

void check_int32_shape(const Dims4& shape, const char* name) {
  check_dims(shape, name);
  check_int32_elements(shape, name);
}

int64_t dilated_filter_extent(int64_t filter, int64_t dilation) {
  return (filter - 1) * dilation + 1;
}

int64_t conv_output_extent(int64_t input, int64_t filter, int64_t pad, int64_t stride, int64_t dilation) {
  const int64_t padded = input + 2 * pad;
  const int64_t extent = dilated_filter_extent(filter, dilation);
  return padded < extent ? 0 : (padded - extent) / stride + 1;
}

Dims4 logical_dims(const Dims4& s, Layout layout) {
  return layout == Layout::NCHW ? s : Dims4{s[0], s[3], s[1], s[2]};
}

Dims4 layout_dims(const Dims4& n, Layout layout) {
  return layout == Layout::NCHW ? n : Dims4{n[0], n[2], n[3], n[1]};
}

ConvParams make_conv_params(ConvDirection direction, const ConvSpec& spec, const Dims4& x_shape, const Dims4& w_shape,
                            uint8_t epilogue, const char* x_name, const char* w_name) {
  check_dims(x_shape, x_name);
  check_dims(w_shape, w_name);
  const Dims4 x = logical_dims(x_shape, spec.layout);
  const Dims4 w = logical_dims(w_shape, spec.layout);
  const int64_t groups = spec.groups;
  if (x[1] % groups != 0) {
    throw ValueError(std::string(x_name) + ": C=" + std::to_string(x[1]) +
                     " input channels are not divisible by groups=" + std::to_string(groups));
  }
  if (w[1] != x[1] / groups) {
    throw ValueError(std::string(w_name) + ": expected " + std::to_string(x[1] / groups) +
                     " input channels per group (" + x_name + " has C=" + std::to_string(x[1]) +
                     ", groups=" + std::to_string(groups) + "), the filter has " + std::to_string(w[1]) +
                     " (filter K, C/groups, R, S = " + dims_str(w) + ")");
  }
  if (w[0] % groups != 0) {
    throw ValueError(std::string(w_name) + ": K=" + std::to_string(w[0]) +
                     " output channels are not divisible by groups=" + std::to_string(groups));
  }
  Dims4 y{x[0], w[0], 0, 0};
  for (int i = 0; i < 2; ++i) {
    y[2 + i] = conv_output_extent(x[2 + i], w[2 + i], spec.padding[i], spec.stride[i], spec.dilation[i]);
    if (y[2 + i] == 0) {
      throw ValueError(std::string(x_name) + ": the padded input " + (i == 0 ? "height " : "width ") +
                       std::to_string(x[2 + i] + 2 * int64_t(spec.padding[i])) +
                       " is smaller than the dilated filter extent " +
                       std::to_string(dilated_filter_extent(w[2 + i], spec.dilation[i])) + " (" + x_name +
                       " N, C, H, W = " + dims_str(x) + ", filter " + dims_str(w) + ")");
    }
  }
  check_int32_elements(x, x_name);
  check_int32_elements(w, w_name);
  check_int32_elements(y, "output");
  ConvParams p;
  p.direction = static_cast<uint8_t>(direction);
  p.precision = static_cast<uint8_t>(spec.precision);
  p.layout = static_cast<uint8_t>(spec.layout);
  p.engine = static_cast<uint8_t>(spec.engine);
  p.epilogue = epilogue;
  p.deterministic = spec.deterministic ? 1 : 0;
  p.algo_mode = static_cast<uint8_t>(spec.algo_mode);
  p.fixed_algo = spec.fixed_algo;
  copy_dims(p.x, x);
  copy_dims(p.w, w);
  copy_dims(p.y, y);
  for (int i = 0; i < 2; ++i) {
    p.pad[i] = spec.padding[i];
    p.stride[i] = spec.stride[i];
    p.dilation[i] = spec.dilation[i];
  }
  p.groups = spec.groups;
  return p;
}

Dims4 output_shape(const ConvParams& p) {
  return layout_dims({p.y[0], p.y[1], p.y[2], p.y[3]}, static_cast<Layout>(p.layout));
}

void check_key_geometry(const ConvParams& p) {
  // Geometry does not depend on the layout: check the logical shapes as NCHW, so errors show the key's own dims.
  const ConvSpec spec =
      ConvSpec::make({p.stride[0], p.stride[1]}, {p.pad[0], p.pad[1]}, {p.dilation[0], p.dilation[1]}, p.groups,
                     Layout::NCHW, static_cast<Precision>(p.precision), static_cast<ConvEngineKind>(p.engine),
                     static_cast<AlgoMode>(p.algo_mode), p.fixed_algo, p.deterministic != 0);
  const Dims4 x{p.x[0], p.x[1], p.x[2], p.x[3]};
  const Dims4 w{p.w[0], p.w[1], p.w[2], p.w[3]};
  const Dims4 y{p.y[0], p.y[1], p.y[2], p.y[3]};
  const ConvParams rebuilt =
      make_conv_params(static_cast<ConvDirection>(p.direction), spec, x, w, p.epilogue, "x", "w");
  const Dims4 expected{rebuilt.y[0], rebuilt.y[1], rebuilt.y[2], rebuilt.y[3]};
  if (expected != y) {
    throw ValueError("y=" + dims_str(y) + ": the output of x=" + dims_str(x) + " and w=" + dims_str(w) + " is " +
                     dims_str(expected));
  }
}

}  // namespace rn
