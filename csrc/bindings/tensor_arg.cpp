#include "tensor_arg.h"

#include <cuda_runtime_api.h>

#include <string>

#include "../core/device.h"
#include "../core/error.h"

namespace py = pybind11;

namespace rn {
namespace {

// The DLPack ABI (dmlc/dlpack, v0.8 layout of the unversioned capsule), declared here for the fields we read.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAManaged = 13;
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4;

std::string arg_prefix(const char* name) {
  return std::string(name) + ": ";
}

std::string type_name(py::handle obj) {
  return py::str(py::type::of(obj).attr("__qualname__"));
}

std::string module_type_name(py::handle obj) {
  py::object type = py::type::of(obj);
  std::string module = py::hasattr(type, "__module__") ? std::string(py::str(type.attr("__module__"))) : "";
  return (module.empty() || module == "builtins" ? "" : module + ".") + type_name(obj);
}

// Whether the element type named by a __cuda_array_interface__ typestr can hold `dtype`.
bool typestr_matches(const std::string& typestr, DType dtype) {
  if (typestr.size() < 3) return false;
  const std::string kind_size = typestr.substr(1);
  switch (dtype) {
    case DType::F32:
      return kind_size == "f4";
    case DType::F16:
      return kind_size == "f2";
    case DType::BF16:
      return kind_size == "u2" || kind_size == "V2" || kind_size == "i2";
  }
  return false;
}

bool dlpack_dtype_matches(const DLDataType& t, DType dtype) {
  if (t.lanes != 1) return false;
  switch (dtype) {
    case DType::F32:
      return t.code == kDLFloat && t.bits == 32;
    case DType::F16:
      return t.code == kDLFloat && t.bits == 16;
    case DType::BF16:
      return (t.code == kDLBfloat || t.code == kDLUInt || t.code == kDLInt) && t.bits == 16;
  }
  return false;
}

std::string dlpack_dtype_name(const DLDataType& t) {
  const std::string kind = t.code == kDLFloat    ? "float"
                           : t.code == kDLBfloat ? "bfloat"
                           : t.code == kDLInt    ? "int"
                           : t.code == kDLUInt   ? "uint"
                                                 : "code" + std::to_string(t.code) + "_";
  return kind + std::to_string(t.bits);
}

void check_rank_and_size(const TensorView& view, const char* name, const TensorArgOptions& options) {
  if (options.ndim >= 0 && view.ndim != options.ndim) {
    throw ValueError(arg_prefix(name) + "expected a " + std::to_string(options.ndim) + "-D array, got shape " +
                     view.shape_str());
  }
  if (view.numel() == 0) {
    throw ValueError(arg_prefix(name) + "empty arrays are not supported (shape " + view.shape_str() + ")");
  }
}

// strides (in bytes, possibly absent) describe a C-contiguous array?
template <class StrideAt>
bool is_c_contiguous(const TensorView& view, bool has_strides, StrideAt stride_at, int64_t unit) {
  if (!has_strides) return true;
  int64_t expected = unit;
  for (int i = view.ndim - 1; i >= 0; --i) {
    if (view.shape[i] != 1 && stride_at(i) != expected) return false;
    expected *= view.shape[i];
  }
  return true;
}

// One cudaPointerGetAttributes per operand and call. Not cached per pointer: memory is freed and its addresses
// reused (by cupy's pool, or for host memory), so a cached answer could be stale.
void check_pointer_device(const void* data, const char* name) {
  const int device = current_device();
  cudaPointerAttributes attributes{};
  const cudaError_t err = cudaPointerGetAttributes(&attributes, data);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw TypeError(arg_prefix(name) + "pointer is not CUDA memory (" + cudaGetErrorName(err) + ")");
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    throw TypeError(arg_prefix(name) + "expected device memory, got host memory");
  }
  if (attributes.device != device) {
    throw ValueError(arg_prefix(name) + "array is on CUDA device " + std::to_string(attributes.device) +
                     " but the current device is " + std::to_string(device));
  }
}

// ---- cupy.ndarray fast path (see tensor_arg.h for why) ----

// cupy.ndarray and the numpy dtype objects cupy arrays of the storage dtypes carry. Looked up in sys.modules
// once cupy has been imported by the caller (never imported from here: ops on other arrays must not need
// cupy); strong references, never released (cupy and numpy outlive every op).
struct CupyTypes {
  PyObject* ndarray = nullptr;
  PyObject* float32 = nullptr;
  PyObject* float16 = nullptr;
  PyObject* uint16 = nullptr;
  PyObject* int16 = nullptr;
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
    types->float32 = dtype("float32").release().ptr();
    types->float16 = dtype("float16").release().ptr();
    types->uint16 = dtype("uint16").release().ptr();
    types->int16 = dtype("int16").release().ptr();
    found = types;
  } catch (const py::error_already_set&) {
    return nullptr;  // a half-imported or unusual cupy: the general parser serves (the error is cleared)
  }
  return found;
}

// numpy's builtin dtypes are singletons, so identity is the whole test; an equal dtype that is not the
// singleton (there is none for these types in practice) just takes the general parser.
bool is_storage_dtype(const CupyTypes& t, PyObject* numpy_dtype, DType dtype) {
  switch (dtype) {
    case DType::F32:
      return numpy_dtype == t.float32;
    case DType::F16:
      return numpy_dtype == t.float16;
    case DType::BF16:
      return numpy_dtype == t.uint16 || numpy_dtype == t.int16;
  }
  return false;
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

// The view of an exact cupy.ndarray that tensor_arg would accept, read from the attributes that cupy's
// __cuda_array_interface__ is made of (dtype, shape, _c_contiguous -> strides None, data.ptr). Returns false,
// with no Python error set, whenever the array is anything but that plain accepted case.
bool from_cupy_ndarray(py::handle obj, DType dtype, const TensorArgOptions& options, TensorView* out) {
  const CupyTypes* cupy = cupy_types();
  if (cupy == nullptr || reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())) != cupy->ndarray) return false;
  static PyObject* const kDtype = interned("dtype");
  static PyObject* const kCContiguous = interned("_c_contiguous");
  static PyObject* const kShape = interned("shape");
  static PyObject* const kData = interned("data");
  static PyObject* const kPtr = interned("ptr");

  const py::object numpy_dtype = attribute_or_null(obj, kDtype);
  if (!numpy_dtype || !is_storage_dtype(*cupy, numpy_dtype.ptr(), dtype)) return false;
  const py::object contiguous = attribute_or_null(obj, kCContiguous);
  if (!contiguous || contiguous.ptr() != Py_True) return false;
  const py::object shape = attribute_or_null(obj, kShape);
  if (!shape || !PyTuple_CheckExact(shape.ptr())) return false;
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  if (ndim < 1 || ndim > TensorView::kMaxDims || (options.ndim >= 0 && ndim != options.ndim)) return false;
  TensorView view;
  view.dtype = dtype;
  view.ndim = static_cast<int>(ndim);
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    const long long extent = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    if (extent == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    view.shape[i] = extent;
  }
  if (view.numel() <= 0) return false;  // empty: the general parser names it
  const py::object memory = attribute_or_null(obj, kData);
  if (!memory) return false;
  const py::object pointer = attribute_or_null(memory, kPtr);
  if (!pointer || !PyLong_Check(pointer.ptr())) return false;
  const unsigned long long address = PyLong_AsUnsignedLongLong(pointer.ptr());
  if (address == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  view.data = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
  *out = view;
  return true;
}

// `interface_obj`: obj.__cuda_array_interface__, fetched once by the caller (cupy builds it anew on each read).
TensorView from_cuda_array_interface(py::handle obj, const py::object& interface_obj, const char* name, DType dtype,
                                     const TensorArgOptions& options) {
  py::dict iface = interface_obj;
  TensorView view;
  view.dtype = dtype;
  const std::string typestr = py::str(iface["typestr"]);
  if (!typestr_matches(typestr, dtype)) {
    py::object np_dtype = py::hasattr(obj, "dtype") ? py::object(obj.attr("dtype")) : py::str(typestr);
    throw TypeError(arg_prefix(name) + "expected a " + dtype_name(dtype) + " array, got " +
                    std::string(py::str(np_dtype)) +
                    (dtype == DType::BF16 ? " (bfloat16 is passed as uint16 bit patterns)" : ""));
  }
  py::tuple shape = iface["shape"];
  if (shape.size() > TensorView::kMaxDims) throw ValueError(arg_prefix(name) + "too many dimensions");
  view.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < view.ndim; ++i) view.shape[i] = shape[i].cast<int64_t>();
  check_rank_and_size(view, name, options);
  py::object strides = iface.contains("strides") ? py::object(iface["strides"]) : py::none();
  const bool has_strides = !strides.is_none();
  py::tuple stride_tuple = has_strides ? py::tuple(strides) : py::tuple();
  if (!is_c_contiguous(view, has_strides, [&](int i) { return stride_tuple[i].cast<int64_t>(); }, dtype_size(dtype))) {
    throw ValueError(arg_prefix(name) + "expected a C-contiguous array, got shape " + view.shape_str() +
                     " with strides " + std::string(py::str(strides)) + " (use cupy.ascontiguousarray)");
  }
  py::tuple data = iface["data"];
  view.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  return view;
}

TensorView from_dlpack(py::handle obj, const char* name, DType dtype, const TensorArgOptions& options) {
  py::tuple dev = obj.attr("__dlpack_device__")();
  const int device_type = dev[0].cast<int>();
  if (device_type != kDLCUDA && device_type != kDLCUDAManaged) {
    throw TypeError(arg_prefix(name) + "expected a CUDA array, got a " + module_type_name(obj) +
                    (device_type == 1 ? std::string(" in host memory (copy it with cupy.asarray)")
                                      : " on DLPack device type " + std::to_string(device_type)));
  }
  // The capsule's own destructor calls the producer's deleter; the producer object (alive in the caller)
  // keeps the memory valid for the duration of the op.
  py::capsule capsule = obj.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (!managed) throw TypeError(arg_prefix(name) + "__dlpack__ did not return a 'dltensor' capsule");
  const DLTensor& t = managed->dl_tensor;
  TensorView view;
  view.dtype = dtype;
  if (!dlpack_dtype_matches(t.dtype, dtype)) {
    throw TypeError(arg_prefix(name) + "expected a " + dtype_name(dtype) + " array, got " + dlpack_dtype_name(t.dtype));
  }
  if (t.ndim > TensorView::kMaxDims) throw ValueError(arg_prefix(name) + "too many dimensions");
  view.ndim = t.ndim;
  for (int i = 0; i < view.ndim; ++i) view.shape[i] = t.shape[i];
  check_rank_and_size(view, name, options);
  // DLPack strides count elements, not bytes.
  if (!is_c_contiguous(view, t.strides != nullptr, [&](int i) { return t.strides[i]; }, 1)) {
    throw ValueError(arg_prefix(name) + "expected a C-contiguous array, got shape " + view.shape_str() +
                     " with non-contiguous strides");
  }
  view.data = static_cast<char*>(t.data) + t.byte_offset;
  return view;
}

// The general parser: __cuda_array_interface__, else DLPack, else a TypeError saying what obj is.
TensorView from_any_array(py::handle obj, const char* name, DType dtype, const TensorArgOptions& options) {
  // One read of the interface (like hasattr, an error while reading it counts as absent).
  py::object iface = py::getattr(obj, "__cuda_array_interface__", py::none());
  if (!iface.is_none()) return from_cuda_array_interface(obj, iface, name, dtype, options);
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) {
    return from_dlpack(obj, name, dtype, options);
  }
  throw TypeError(arg_prefix(name) +
                  "expected a CUDA array (cupy.ndarray or any object with "
                  "__cuda_array_interface__ or DLPack), got " +
                  module_type_name(obj) +
                  (py::hasattr(obj, "__array_interface__") ? " in host memory (copy it with cupy.asarray)" : ""));
}

}  // namespace

TensorView tensor_arg(py::handle obj, const char* name, DType dtype, TensorArgOptions options) {
  if (obj.is_none()) throw TypeError(arg_prefix(name) + "expected a CUDA array, got None");
  TensorView view;
  if (!from_cupy_ndarray(obj, dtype, options, &view)) view = from_any_array(obj, name, dtype, options);
  if (options.check_device) {
    check_pointer_device(view.data, name);
    view.device = current_device();
  }
  return view;
}

void check_on_current_device(const TensorView& view, const char* name) {
  if (view.defined()) check_pointer_device(view.data, name);
}

TensorView optional_tensor_arg(py::handle obj, const char* name, DType dtype, TensorArgOptions options) {
  if (obj.is_none()) return TensorView{};
  return tensor_arg(obj, name, dtype, options);
}

void check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expected) {
  bool same = static_cast<int>(expected.size()) == t.ndim;
  int i = 0;
  for (int64_t e : expected) same = same && t.shape[i++] == e;
  if (!same) {
    std::string want = "(";
    i = 0;
    for (int64_t e : expected) want += (i++ ? ", " : "") + std::to_string(e);
    throw ValueError(arg_prefix(name) + "expected shape " + want + (expected.size() == 1 ? ",)" : ")") + ", got " +
                     t.shape_str());
  }
}

void check_same_shape(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name) {
  bool same = a.ndim == b.ndim;
  for (int i = 0; same && i < a.ndim; ++i) same = a.shape[i] == b.shape[i];
  if (!same) {
    throw ValueError(std::string(a_name) + " and " + b_name + " must have the same shape, got " + a.shape_str() +
                     " and " + b.shape_str());
  }
}

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32" || name == "tf32") return DType::F32;
  if (name == "fp16" || name == "float16") return DType::F16;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  throw ValueError("dtype: expected one of 'fp32', 'fp16', 'bf16', got '" + name + "'");
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "tf32") return Precision::TF32;
  if (name == "fp16") return Precision::FP16;
  if (name == "bf16") return Precision::BF16;
  throw ValueError("precision: expected one of 'fp32', 'tf32', 'fp16', 'bf16', got '" + name + "'");
}

Layout parse_layout(const std::string& name) {
  if (name == "NCHW") return Layout::NCHW;
  if (name == "NHWC") return Layout::NHWC;
  throw ValueError("layout: expected 'NCHW' or 'NHWC', got '" + name + "'");
}

}  // namespace rn
