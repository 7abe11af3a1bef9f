// Reads a __cuda_array_interface__ dict (numba's protocol, versions 0 to 3) into a RawArray. Every field the
// protocol defines is looked at: a field that is missing or of the wrong type is a TypeError, a value this
// package cannot honour (another version, a mask, a big-endian typestr, strides of the wrong length) a
// ValueError or TypeError naming the argument. The stream field is not used: ops run on the stream they are
// given, and the caller orders its work with it.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "../core/error.h"
#include "array_sources.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace rn {
namespace {

constexpr long kMaxInterfaceVersion = 3;

std::string interface_prefix(const char* name) {
  return arg_prefix(name) + "__cuda_array_interface__";
}

std::string repr_text(py::handle obj) {
  return py::repr(obj);
}

// The value of a required key, or a TypeError naming it.
py::handle required(const py::dict& iface, const char* key, const char* name) {
  PyObject* value = PyDict_GetItemString(iface.ptr(), key);  // borrowed
  if (value == nullptr) throw TypeError(interface_prefix(name) + " has no '" + key + "' entry");
  return value;
}

// The entry of an optional key, or a null handle for a key that is absent or None.
py::handle optional(const py::dict& iface, const char* key) {
  PyObject* value = PyDict_GetItemString(iface.ptr(), key);  // borrowed
  return value == nullptr || value == Py_None ? py::handle() : py::handle(value);
}

// "<f4" -> the element kind and size; TypeError for what is not a typestr or is big-endian.
void read_typestr(py::handle typestr_obj, const char* name, RawArray* raw) {
  if (!PyUnicode_Check(typestr_obj.ptr())) {
    throw TypeError(interface_prefix(name) + " 'typestr' must be a str, got " + repr_text(typestr_obj));
  }
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(typestr_obj.ptr(), &size);  // NULL for text that is not UTF-8
  if (utf8 == nullptr) {
    PyErr_Clear();
    throw TypeError(interface_prefix(name) + " 'typestr' is not a typestr: " + repr_text(typestr_obj));
  }
  const std::string typestr(utf8, static_cast<size_t>(size));
  raw->dtype_text = typestr;
  const bool well_formed = typestr.size() >= 3 && std::string("<>|=").find(typestr[0]) != std::string::npos &&
                           std::isdigit(static_cast<unsigned char>(typestr[2]));
  if (!well_formed) throw TypeError(interface_prefix(name) + " 'typestr' is not a typestr: '" + typestr + "'");
  const size_t digits_end = std::min(typestr.find_first_not_of("0123456789", 2), typestr.size());
  raw->itemsize = std::stoi(typestr.substr(2, std::min<size_t>(digits_end - 2, 6)));
  // '>' is big-endian: the kernels and cuDNN read little-endian values ('|' is for one-byte types, '=' native).
  if (typestr[0] == '>' && raw->itemsize > 1) {
    throw TypeError(arg_prefix(name) + "big-endian arrays are not supported, got typestr '" + typestr + "'");
  }
  const std::string kind_size = typestr.substr(1);
  raw->kind = kind_size == "f4"   ? ElementKind::F32
              : kind_size == "f2" ? ElementKind::F16
              : kind_size == "u2" ? ElementKind::U16
              : kind_size == "i2" ? ElementKind::I16
              : kind_size == "V2" ? ElementKind::V2
              : kind_size == "i4" ? ElementKind::I32
              : kind_size == "u1" ? ElementKind::U8
              : kind_size == "i1" ? ElementKind::I8
              : kind_size == "f8" ? ElementKind::F64
                                  : ElementKind::Other;
}

// A tuple (or list) of ints, the shape or the strides, into `out`; returns its length. `expected_len` >= 0:
// the strides, which must have one entry per dimension.
int read_int_tuple(py::handle tuple, const char* key, const char* name, int expected_len, int64_t* out) {
  if (!PyTuple_Check(tuple.ptr()) && !PyList_Check(tuple.ptr())) {
    throw TypeError(interface_prefix(name) + " '" + key + "' must be a tuple of ints, got " + repr_text(tuple));
  }
  const Py_ssize_t n = py::len(tuple);
  if (expected_len >= 0 && n != expected_len) {
    throw ValueError(interface_prefix(name) + " '" + key + "' " + repr_text(tuple) + " has " + std::to_string(n) +
                     " entries for a " + std::to_string(expected_len) + "-D array");
  }
  if (n > TensorView::kMaxDims) {
    throw ValueError(arg_prefix(name) + "too many dimensions (" + std::to_string(n) + "; at most " +
                     std::to_string(TensorView::kMaxDims) + ")");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(tuple);
  for (Py_ssize_t i = 0; i < n; ++i) {
    bool overflow = false;
    if (!read_int64(seq[i], &out[i], &overflow)) {
      throw TypeError(interface_prefix(name) + " '" + key + "' must be a tuple of ints, got " + repr_text(tuple));
    }
    if (overflow)
      throw ValueError(arg_prefix(name) + key + " " + repr_text(tuple) + ": an entry does not fit in int64");
  }
  return static_cast<int>(n);
}

}  // namespace

void read_cuda_array_interface(py::handle obj, const py::object& interface_obj, const char* name, RawArray* raw) {
  if (!PyDict_Check(interface_obj.ptr())) {
    throw TypeError(interface_prefix(name) + " must be a dict, got " + module_type_name(interface_obj));
  }
  const py::dict iface = py::reinterpret_borrow<py::dict>(interface_obj);
  raw->owner = obj;

  const py::handle version = required(iface, "version", name);
  if (!PyLong_Check(version.ptr()) || PyBool_Check(version.ptr())) {
    throw TypeError(interface_prefix(name) + " 'version' must be an int, got " + repr_text(version));
  }
  const long v = PyLong_AsLong(version.ptr());
  if (v < 0 || v > kMaxInterfaceVersion || PyErr_Occurred()) {
    PyErr_Clear();
    throw ValueError(interface_prefix(name) + " version " + repr_text(version) + " is not supported (0 to " +
                     std::to_string(kMaxInterfaceVersion) + " are)");
  }
  read_typestr(required(iface, "typestr", name), name, raw);
  raw->ndim = read_int_tuple(required(iface, "shape", name), "shape", name, -1, raw->shape.data());

  const py::handle strides = optional(iface, "strides");
  raw->has_strides = bool(strides);
  raw->strides_in_bytes = true;
  if (strides) read_int_tuple(strides, "strides", name, raw->ndim, raw->strides.data());

  const py::handle data = required(iface, "data", name);
  if (!PyTuple_Check(data.ptr()) || PyTuple_GET_SIZE(data.ptr()) != 2) {
    throw TypeError(interface_prefix(name) + " 'data' must be a (pointer, read_only) pair, got " + repr_text(data));
  }
  PyObject* pointer = PyTuple_GET_ITEM(data.ptr(), 0);
  PyObject* read_only = PyTuple_GET_ITEM(data.ptr(), 1);
  if (!PyLong_Check(pointer) || PyBool_Check(pointer) || !PyBool_Check(read_only)) {
    throw TypeError(interface_prefix(name) + " 'data' must be a (pointer, read_only) pair, got " + repr_text(data));
  }
  const unsigned long long address = PyLong_AsUnsignedLongLong(pointer);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw ValueError(interface_prefix(name) + " 'data' pointer " + repr_text(pointer) + " is not an address");
  }
  raw->data = static_cast<uintptr_t>(address);
  raw->read_only = read_only == Py_True;

  if (optional(iface, "mask")) {
    throw ValueError(arg_prefix(name) + "masked arrays are not supported (__cuda_array_interface__ has a 'mask')");
  }
}

}  // namespace rn
