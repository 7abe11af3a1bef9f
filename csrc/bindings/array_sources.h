// What an array object says about itself, read from one of its three possible descriptions before anything is
// checked: a cupy.ndarray's attributes (the fast path), a __cuda_array_interface__ dict, or a DLPack capsule.
// The readers only refuse what they cannot describe (a malformed interface, a host array); tensor_arg.cpp
// checks the description, so every source is held to the same rules. Private to bindings/.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <string>

#include "../core/tensor.h"

namespace rn {

// The element types the parser tells apart; everything else is Other (named by RawArray::dtype_text).
enum class ElementKind : uint8_t { F32, F16, BF16, U16, I16, V2, I32, U8, I8, F64, Other };

struct RawArray {
  ElementKind kind = ElementKind::Other;
  int itemsize = 0;  // bytes per element as the source states it
  int ndim = 0;
  std::array<int64_t, TensorView::kMaxDims> shape{};
  bool has_strides = false;
  bool strides_in_bytes = true;  // __cuda_array_interface__ counts bytes, DLPack elements
  std::array<int64_t, TensorView::kMaxDims> strides{};
  uintptr_t data = 0;
  bool read_only = false;  // __cuda_array_interface__ data[1]; DLPack 1.x READ_ONLY flag
  bool copied = false;     // DLPack 1.x IS_COPIED flag: the memory is not the producer's own array
  // How error messages name the element type: the object's own dtype ("float32", "int32") when it has one, else
  // the typestr or DLPack code. Filled lazily by describe_dtype(): only errors need it.
  pybind11::handle owner;
  std::string dtype_text;
};

// "float32": the element type as messages show it.
std::string describe_dtype(const RawArray& raw);

// Describes an exact cupy.ndarray from its attributes. Returns false (no Python error set) whenever the array is
// not a plain cupy.ndarray of a dtype the parser knows, or is not C-contiguous: the general parser then reads it.
bool read_cupy_ndarray(pybind11::handle obj, RawArray* raw);

// `interface_obj`: obj.__cuda_array_interface__, read once by the caller (cupy builds it anew on each read).
void read_cuda_array_interface(pybind11::handle obj, const pybind11::object& interface_obj, const char* name,
                               RawArray* raw);

// Asks for a DLPack 1.x capsule (max_version) and takes the unversioned one from older producers.
void read_dlpack(pybind11::handle obj, const char* name, RawArray* raw);

// Reads a Python int (or an object with __index__, such as a NumPy integer; never a bool) into *value. False
// when it is not one (no Python error set); *overflow is set when it is an int beyond int64.
bool read_int64(pybind11::handle item, int64_t* value, bool* overflow);

// "x: ": every message starts with the argument's name.
inline std::string arg_prefix(const char* name) {
  return std::string(name) + ": ";
}

// "numpy.ndarray", "list": what an object is, for messages.
std::string module_type_name(pybind11::handle obj);

}  // namespace rn
