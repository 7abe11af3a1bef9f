// The one place where Python arrays become TensorViews. Accepts any object exposing
// __cuda_array_interface__ (cupy, numba, ...) or DLPack (__dlpack__ / __dlpack_device__: torch, jax, ...).
// Checks, in this order, and raises naming the argument: is it a device array at all (TypeError), dtype
// (TypeError), rank and emptiness (ValueError), C-contiguity (ValueError), and finally that the memory lives
// on the current CUDA device (TypeError for host memory, ValueError for another device).
//
// Cost per call (ops call this for every operand): a cupy.ndarray of exactly that type is read through its
// attributes (dtype, _c_contiguous, shape, data.ptr: ~5 attribute reads) instead of __cuda_array_interface__,
// which cupy builds as a fresh dict every time (shape and strides tuples, dtype.str, dtype.descr, the current
// stream). The fast path only ever accepts: anything it does not recognise (another dtype, non-contiguous, a
// rank or size the options refuse, a cupy without those attributes) goes through the general parser, which
// raises the errors above, so accepted views and error messages are the same on both paths.
//
// bfloat16: cupy has no bfloat16 dtype, so a bf16 argument may be a uint16 array holding bf16 bit patterns,
// an ml_dtypes bfloat16 array ("<V2"), or a DLPack bfloat16 tensor.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>

#include "../core/tensor.h"

namespace rn {

struct TensorArgOptions {
  int ndim = -1;             // required rank, -1: any
  bool check_device = true;  // tests of the parser on CPU-only machines turn this off
};

TensorView tensor_arg(pybind11::handle obj, const char* name, DType dtype, TensorArgOptions options = {});
// None gives an undefined view (view.defined() == false).
TensorView optional_tensor_arg(pybind11::handle obj, const char* name, DType dtype, TensorArgOptions options = {});

// The device check of tensor_arg alone, for a view parsed with check_device = false (ops validate every
// argument on the host first, then check the device of the views they already have instead of parsing the
// arrays again). Does nothing for an undefined view.
void check_on_current_device(const TensorView& view, const char* name);

// ValueError unless `t` has exactly `expected` shape.
void check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expected);
// ValueError unless `a` and `b` have the same shape.
void check_same_shape(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name);

DType parse_dtype(const std::string& name);          // "fp32"/"float32", "fp16"/"float16", "bf16"/"bfloat16"
Precision parse_precision(const std::string& name);  // "fp32" | "tf32" | "fp16" | "bf16"
Layout parse_layout(const std::string& name);        // "NCHW" | "NHWC"

// A stream handle passed from Python as an integer (cupy's Stream.ptr); 0 is the legacy default stream.
inline cudaStream_t stream_arg(uintptr_t ptr) {
  return reinterpret_cast<cudaStream_t>(ptr);
}

}  // namespace rn
