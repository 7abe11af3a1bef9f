// The one place where Python arrays become TensorViews. Accepts any object exposing
// __cuda_array_interface__ (cupy, numba, ...) or DLPack (__dlpack__ / __dlpack_device__: torch, jax, ...).
// Every source is first read into the same description (array_sources.h), which one validator then checks, in
// this order, raising an error that names the argument:
//   1. is it a device array at all, and is its interface well formed (TypeError: a missing or mistyped field,
//      a big-endian typestr, a capsule of another kind; ValueError: an unknown interface version, a mask,
//      a strides tuple of the wrong length, a DLPack tensor with a negative rank or a NULL shape);
//   2. the element type (TypeError), or, when the dtype is inferred, which dtype the array holds;
//   3. rank, then the dimensions (ValueError): none negative, none zero (empty arrays are refused), the
//      element count and byte size within int64, each within int when asked (cuDNN's 4-D descriptors);
//   4. C-contiguity (ValueError);
//   5. the pointer (ValueError): not NULL, aligned to the element size, its byte range not wrapping around;
//   6. for an output, that the producer does not mark it read-only or as a copy (ValueError);
//   7. finally that the memory lives on the current CUDA device (TypeError for host memory, ValueError for
//      another device, NoGPUError without a GPU).
//
// Cost per call (ops call this for every operand): a cupy.ndarray of exactly that type is read through its
// attributes (dtype, _c_contiguous, shape, data.ptr: ~5 attribute reads) instead of __cuda_array_interface__,
// which cupy builds as a fresh dict every time. Its description then goes through the same validator, so it
// accepts and refuses exactly what the general parser does, with the same messages; a cupy array the fast path
// cannot describe (a dtype it does not know, non-contiguous) takes the general parser.
//
// bfloat16: cupy has no bfloat16 dtype, so a bf16 argument may be a uint16 (or int16) array holding bf16 bit
// patterns, an ml_dtypes bfloat16 array ("<V2"), or a DLPack bfloat16 tensor.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "../core/tensor.h"

namespace rn {

struct TensorArgOptions {
  int ndim = -1;             // required rank, -1: any
  bool check_device = true;  // ops check the device of every parsed view at once, after their host checks
  bool writable = false;     // an output: refuse arrays their producer marks read-only (or DLPack's copies)
  bool int32_dims = false;   // every dimension must fit an int (cuDNN's 4-D descriptors, nchw_dims)
  // The names of the dimensions of an activation ("N, C, H, W"): the rank error then reads "expected a 4-D
  // activation (N, C, H, W)" instead of "expected a 4-D array".
  const char* dims = nullptr;
};

// The options of an array of rank `ndim`, nothing else asked.
inline TensorArgOptions rank(int ndim) {
  TensorArgOptions options;
  options.ndim = ndim;
  return options;
}

// The element type an array argument must have: one dtype, or (dtype=None from Python) the float dtype the array
// holds: float32 -> F32, float16 -> F16, a DLPack bfloat16 -> BF16. A 16-bit integer array is taken as bf16
// bits when inferring only with `uint16_is_bf16` (cast, where it has no other meaning), and is otherwise a
// TypeError asking for dtype='bf16' (it could hold anything).
struct DTypeRequest {
  enum class Mode : uint8_t { Exact, Infer };
  Mode mode = Mode::Exact;
  DType dtype = DType::F32;     // Exact only
  bool uint16_is_bf16 = false;  // Infer only

  DTypeRequest(DType exact) : dtype(exact) {}  // NOLINT(google-explicit-constructor): a DType asks for itself
  static DTypeRequest infer(bool uint16_is_bf16 = false) {
    DTypeRequest r(DType::F32);
    r.mode = Mode::Infer;
    r.uint16_is_bf16 = uint16_is_bf16;
    return r;
  }
};

TensorView tensor_arg(pybind11::handle obj, const char* name, const DTypeRequest& dtype, TensorArgOptions options = {});
// None gives an undefined view (view.defined() == false).
TensorView optional_tensor_arg(pybind11::handle obj, const char* name, const DTypeRequest& dtype,
                               TensorArgOptions options = {});
inline TensorView tensor_arg(pybind11::handle obj, const char* name, DType dtype, TensorArgOptions options = {}) {
  return tensor_arg(obj, name, DTypeRequest(dtype), options);
}
inline TensorView optional_tensor_arg(pybind11::handle obj, const char* name, DType dtype,
                                      TensorArgOptions options = {}) {
  return optional_tensor_arg(obj, name, DTypeRequest(dtype), options);
}

// The device check of tensor_arg alone (step 7), for a view parsed with check_device = false: ops validate every
// argument on the host first, then check the device of the views they already have instead of parsing the
// arrays again. Sets view->device. Does nothing for an undefined view or one without memory yet (an output
// still to be allocated).
void check_on_current_device(TensorView* view, const char* name);
void check_on_current_device(const TensorView& view, const char* name);

// Step 3 for a shape known as numbers (a view's, or a shape tuple from Python): ValueError naming `name` for a
// negative dimension, an element count or byte size (of `itemsize`-byte elements) beyond int64, or, with
// `int32_dims`, a dimension beyond int. Zero dimensions are the caller's to judge.
void check_extents(const char* name, const int64_t* shape, int ndim, int itemsize, bool int32_dims);

// ValueError unless `t` has exactly `expected` shape: "name: expected shape (4,) (why), got (3,)", where `why`
// says where the expectation comes from ("one per output channel"; none when null).
void check_shape(const TensorView& t, const char* name, const std::vector<int64_t>& expected,
                 const char* why = nullptr);
// ValueError unless `a` and `b` have the same shape.
void check_same_shape(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name);

// "(2, 3)", "(4,)": a shape as Python prints it.
std::string shape_text(const int64_t* shape, int ndim);

// A stream handle passed from Python as an integer (cupy's Stream.ptr); 0 is the legacy default stream.
inline cudaStream_t stream_arg(uintptr_t ptr) {
  return reinterpret_cast<cudaStream_t>(ptr);
}

}  // namespace rn
