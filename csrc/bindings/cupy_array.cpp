// The cupy.ndarray fast path of tensor_arg (see tensor_arg.h for why it exists): the description of an exact
// cupy.ndarray read from the attributes that cupy's __cuda_array_interface__ is made of (dtype, shape,
// _c_contiguous -> strides None, data.ptr; cupy has no read-only arrays).
#include <pybind11/pybind11.h>

#include "array_sources.h"

namespace py = pybind11;

namespace rn {
namespace {

// cupy.ndarray and the numpy dtype objects of the element types the parser knows. Looked up in sys.modules once
// cupy has been imported by the caller (never imported from here: ops on other arrays must not need cupy);
// strong references, never released (cupy and numpy outlive every op).
struct CupyTypes {
  PyObject* ndarray = nullptr;
  struct Known {
    PyObject* dtype;
    ElementKind kind;
    int itemsize;
  };
  std::array<Known, 8> known{};
};

// All of this runs under the GIL (every op is a pybind11 call that keeps it), which serialises the lookup.
const CupyTypes* cupy_types() {
  static const CupyTypes* found = nullptr;
  if (found != nullptr) return found;
  PyObject* modules = PyImport_GetModuleDict();  // borrowed
  PyObject* cupy = PyDict_GetItemString(modules, "cupy");
  PyObject* numpy = PyDict_GetItemString(modules, "numpy");
  if (cupy == nullptr || numpy == nullptr) return nullptr;  // not imported (yet): the general parser serves
  try {
    py::object ndarray = py::reinterpret_borrow<py::object>(cupy).attr("ndarray");
    if (!PyType_Check(ndarray.ptr())) return nullptr;
    py::object dtype = py::reinterpret_borrow<py::object>(numpy).attr("dtype");
    auto* types = new CupyTypes();
    types->ndarray = ndarray.release().ptr();
    types->known = {{{dtype("float32").release().ptr(), ElementKind::F32, 4},
                     {dtype("float16").release().ptr(), ElementKind::F16, 2},
                     {dtype("uint16").release().ptr(), ElementKind::U16, 2},
                     {dtype("int16").release().ptr(), ElementKind::I16, 2},
                     {dtype("int32").release().ptr(), ElementKind::I32, 4},
                     {dtype("uint8").release().ptr(), ElementKind::U8, 1},
                     {dtype("int8").release().ptr(), ElementKind::I8, 1},
                     {dtype("float64").release().ptr(), ElementKind::F64, 8}}};
    found = types;
  } catch (const py::error_already_set&) {
    return nullptr;  // a half-imported or unusual cupy: the general parser serves (the error is cleared)
  }
  return found;
}

// obj.<name>, or a null object (Python error cleared) when the attribute cannot be read.
py::object attribute_or_null(py::handle obj, PyObject* name) {
  PyObject* value = PyObject_GetAttr(obj.ptr(), name);
  if (value == nullptr) PyErr_Clear();
  return py::reinterpret_steal<py::object>(value);
}

PyObject* interned(const char* text) {
  return PyUnicode_InternFromString(text);  // a new reference, kept for the process (attribute names)
}

}  // namespace

bool read_cupy_ndarray(py::handle obj, RawArray* raw) {
  const CupyTypes* cupy = cupy_types();
  if (cupy == nullptr || reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())) != cupy->ndarray) return false;
  static PyObject* const kDtype = interned("dtype");
  static PyObject* const kCContiguous = interned("_c_contiguous");
  static PyObject* const kShape = interned("shape");
  static PyObject* const kData = interned("data");
  static PyObject* const kPtr = interned("ptr");

  // numpy's builtin dtypes are singletons, so identity is the whole test; an equal dtype that is not the
  // singleton (there is none for these types in practice) just takes the general parser.
  const py::object numpy_dtype = attribute_or_null(obj, kDtype);
  if (!numpy_dtype) return false;
  const CupyTypes::Known* known = nullptr;
  for (const auto& k : cupy->known) {
    if (k.dtype == numpy_dtype.ptr()) known = &k;
  }
  if (known == nullptr) return false;
  const py::object contiguous = attribute_or_null(obj, kCContiguous);
  if (!contiguous || contiguous.ptr() != Py_True) return false;
  const py::object shape = attribute_or_null(obj, kShape);
  if (!shape || !PyTuple_CheckExact(shape.ptr())) return false;
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  if (ndim > TensorView::kMaxDims) return false;  // the general parser names it
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    bool overflow = false;
    if (!read_int64(PyTuple_GET_ITEM(shape.ptr(), i), &raw->shape[i], &overflow) || overflow) return false;
  }
  const py::object memory = attribute_or_null(obj, kData);
  if (!memory) return false;
  const py::object pointer = attribute_or_null(memory, kPtr);
  if (!pointer || !PyLong_Check(pointer.ptr())) return false;
  const unsigned long long address = PyLong_AsUnsignedLongLong(pointer.ptr());
  if (address == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  raw->kind = known->kind;
  raw->itemsize = known->itemsize;
  raw->ndim = static_cast<int>(ndim);
  raw->has_strides = false;
  raw->data = static_cast<uintptr_t>(address);
  raw->owner = obj;
  return true;
}

}  // namespace rn
