// Parsers of the non-array arguments the op bindings take from Python as they come (py::handle): layouts,
// dtypes, numbers, ints, pairs of ints and shape tuples. The Python wrappers pass their arguments through
// unchanged, so each value is checked once, here, with an error naming the argument: TypeError for the wrong
// kind of value, ValueError for a value out of range.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <vector>

#include "../core/dtype.h"
#include "tensor_arg.h"

namespace rn {

// "NCHW" / "NHWC", or a resnet_native._C.Layout.
Layout layout_arg(pybind11::handle obj);
// A dtype name (any spelling parse_dtype takes) or a resnet_native._C.DType; None infers the dtype from the
// array (DTypeRequest::infer(uint16_is_bf16)).
DTypeRequest dtype_arg(pybind11::handle obj, bool uint16_is_bf16 = false);
// A storage dtype that cannot be inferred (no array to infer it from): None is a ValueError.
DType exact_dtype_arg(pybind11::handle obj);

// A real number: a Python int or float, or anything with __float__ (NumPy scalars); not a str.
double number_arg(pybind11::handle obj, const char* name);
// A finite number >= 0 (eps).
double eps_arg(pybind11::handle obj);
// `value` unless it lies outside [low, high) (high: no bound when omitted), else ValueError "name: expected a
// value in [0, 1), got 1.0" / "expected a value >= 0, got -0.5".
double check_range(double value, const char* name, double low, double high);
double check_at_least(double value, const char* name, double low);

// An int that fits int32 (not a bool, not a float).
int int32_arg(pybind11::handle obj, const char* name);
// An int within int64 (not a bool, not a float): TypeError "name: expected an int, got float", ValueError when it
// does not fit. Its range is the caller's to judge (its messages say what a bound means).
int64_t int64_arg(pybind11::handle obj, const char* name);
// A sequence (not a str) of exactly `n` ints within int64, each as int64_arg; ValueError "name: expected a tuple
// of n ints, got ..." for anything else. Unlike shape_arg, no range is checked (a convolution's geometry names
// its own limits).
std::vector<int64_t> int64s_arg(pybind11::handle obj, const char* name, int n);
template <size_t N>
std::array<int64_t, N> int64s_arg(pybind11::handle obj, const char* name) {
  const std::vector<int64_t> v = int64s_arg(obj, name, static_cast<int>(N));
  std::array<int64_t, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = v[i];
  return out;
}
// An int, meaning (v, v), or a pair of ints: TypeError for a bool or a non-sequence, ValueError otherwise.
std::array<int, 2> int_pair_arg(pybind11::handle obj, const char* name);

// A shape given as a tuple of `ndim` ints, each >= 1, within int when `int32_dims`. `dims` names the dimensions
// of an activation ("N, C, H, W") for the rank error, as TensorArgOptions::dims does for arrays.
std::vector<int64_t> shape_arg(pybind11::handle obj, const char* name, int ndim, const char* dims, bool int32_dims);

// "N, C, H, W" or "N, H, W, C": how a layout orders an activation's dimensions.
const char* activation_dims(Layout layout);
// The logical (N, C, H, W) of a 4-D activation shape from shape_arg(..., int32_dims = true), stored in `layout`.
std::array<int, 4> shape_nchw(const std::vector<int64_t>& shape, Layout layout);

}  // namespace rn
