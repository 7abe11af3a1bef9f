// tensor_arg: the readers of array_sources.h describe an object, and check_raw() below holds every description
// to the same rules, in the order tensor_arg.h lists.
#include "tensor_arg.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <string>

#include "../core/device.h"
#include "../core/error.h"
#include "array_sources.h"

namespace py = pybind11;

namespace rn {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// ---- element type ----

bool kind_holds(ElementKind kind, DType dtype) {
  switch (dtype) {
    case DType::F32:
      return kind == ElementKind::F32;
    case DType::F16:
      return kind == ElementKind::F16;
    case DType::BF16:
      return kind == ElementKind::BF16 || kind == ElementKind::U16 || kind == ElementKind::I16 ||
             kind == ElementKind::V2;
    case DType::I32:
      return kind == ElementKind::I32;
    case DType::U8:
    case DType::FP8:  // E4M3 codes in a uint8 array
      return kind == ElementKind::U8;
    case DType::I8:
      return kind == ElementKind::I8;
    case DType::F64:
      return kind == ElementKind::F64;
  }
  return false;
}

bool is_16_bit_integer(ElementKind kind) {
  return kind == ElementKind::U16 || kind == ElementKind::I16 || kind == ElementKind::V2;
}

DType resolve_dtype(const RawArray& raw, const char* name, const DTypeRequest& request) {
  if (request.mode == DTypeRequest::Mode::Exact) {
    if (!kind_holds(raw.kind, request.dtype)) {
      const bool an = request.dtype == DType::I32 || request.dtype == DType::I8;
      const char* article = an ? "an " : "a ";  // "an int32", "a uint8"
      throw TypeError(arg_prefix(name) + "expected " + article + dtype_name(request.dtype) + " array, got " +
                      describe_dtype(raw) +
                      (request.dtype == DType::BF16 ? " (bfloat16 is passed as uint16 bit patterns)" : ""));
    }
    return request.dtype;
  }
  if (raw.kind == ElementKind::F32) return DType::F32;
  if (raw.kind == ElementKind::F16) return DType::F16;
  if (raw.kind == ElementKind::BF16 || (request.uint16_is_bf16 && is_16_bit_integer(raw.kind))) return DType::BF16;
  if (is_16_bit_integer(raw.kind)) {
    throw TypeError(arg_prefix(name) +
                    "a 16-bit integer array is taken as bf16 bits only when asked: pass dtype='bf16'");
  }
  throw TypeError(arg_prefix(name) + "expected a float32, float16 or bf16 (uint16) array, got " + describe_dtype(raw));
}

// ---- shape, strides, pointer ----

void check_rank(const RawArray& raw, const char* name, const TensorArgOptions& options) {
  if (raw.ndim == 0) throw ValueError(arg_prefix(name) + "0-D arrays are not supported (use shape (1,))");
  if (options.ndim >= 0 && raw.ndim != options.ndim) {
    const std::string what = options.dims ? "activation (" + std::string(options.dims) + ")" : "array";
    throw ValueError(arg_prefix(name) + "expected a " + std::to_string(options.ndim) + "-D " + what + ", got shape " +
                     shape_text(raw.shape.data(), raw.ndim));
  }
}

bool is_c_contiguous(const RawArray& raw, int itemsize) {
  if (!raw.has_strides) return true;
  int64_t expected = raw.strides_in_bytes ? itemsize : 1;
  for (int i = raw.ndim - 1; i >= 0; --i) {
    if (raw.shape[i] != 1 && raw.strides[i] != expected) return false;
    expected *= raw.shape[i];  // bounded: the byte size was checked to fit int64
  }
  return true;
}

void check_pointer(const RawArray& raw, const char* name, size_t nbytes, int itemsize) {
  if (raw.data == 0) throw ValueError(arg_prefix(name) + "the array's data pointer is NULL");
  if (raw.data % static_cast<uintptr_t>(itemsize) != 0) {
    throw ValueError(arg_prefix(name) + "the data pointer " + std::to_string(raw.data) + " is not aligned to the " +
                     std::to_string(itemsize) + "-byte elements");
  }
  if (nbytes > UINTPTR_MAX - raw.data) {
    throw ValueError(arg_prefix(name) + "the array's memory runs past the end of the address space");
  }
}

TensorView check_raw(const RawArray& raw, const char* name, const DTypeRequest& request,
                     const TensorArgOptions& options) {
  TensorView view;
  view.dtype = resolve_dtype(raw, name, request);
  const int itemsize = dtype_size(view.dtype);
  check_rank(raw, name, options);
  check_extents(name, raw.shape.data(), raw.ndim, itemsize, options.int32_dims);
  view.ndim = raw.ndim;
  for (int i = 0; i < raw.ndim; ++i) view.shape[i] = raw.shape[i];
  if (view.numel() == 0) {
    throw ValueError(arg_prefix(name) + "empty arrays are not supported (shape " + view.shape_str() + ")");
  }
  if (!is_c_contiguous(raw, itemsize)) {
    throw ValueError(arg_prefix(name) + "expected a C-contiguous array, got shape " + view.shape_str() +
                     " with strides " + shape_text(raw.strides.data(), raw.ndim) +
                     (raw.strides_in_bytes ? " (use cupy.ascontiguousarray)" : " (in elements)"));
  }
  check_pointer(raw, name, view.nbytes(), itemsize);
  if (options.writable && raw.read_only) throw ValueError(arg_prefix(name) + "the array is read-only");
  if (options.writable && raw.copied) {
    throw ValueError(arg_prefix(name) + "__dlpack__ gave a copy of the array: an output must be its own memory");
  }
  view.data = reinterpret_cast<void*>(raw.data);
  view.read_only = raw.read_only;
  return view;
}

// One cudaPointerGetAttributes per operand and call. Not cached per pointer: memory is freed and its addresses
// reused (by cupy's pool, or for host memory), so a cached answer could be stale.
int check_pointer_device(const void* data, const char* name) {
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
  return device;
}

// The general parser: __cuda_array_interface__, else DLPack, else a TypeError saying what obj is.
void read_any_array(py::handle obj, const char* name, RawArray* raw) {
  // One read of the interface (like hasattr, an error while reading it counts as absent).
  py::object iface = py::getattr(obj, "__cuda_array_interface__", py::none());
  if (!iface.is_none()) return read_cuda_array_interface(obj, iface, name, raw);
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) return read_dlpack(obj, name, raw);
  throw TypeError(arg_prefix(name) +
                  "expected a CUDA array (cupy.ndarray or any object with "
                  "__cuda_array_interface__ or DLPack), got " +
                  module_type_name(obj) +
                  (py::hasattr(obj, "__array_interface__") ? " in host memory (copy it with cupy.asarray)" : ""));
}

}  // namespace

// ---- shared with the readers ----

std::string module_type_name(py::handle obj) {
  py::object type = py::type::of(obj);
  std::string module = py::hasattr(type, "__module__") ? std::string(py::str(type.attr("__module__"))) : "";
  const std::string type_name = py::str(type.attr("__qualname__"));
  return (module.empty() || module == "builtins" ? "" : module + ".") + type_name;
}

std::string describe_dtype(const RawArray& raw) {
  if (raw.owner) {
    PyObject* dtype = PyObject_GetAttrString(raw.owner.ptr(), "dtype");
    if (dtype != nullptr) return py::str(py::reinterpret_steal<py::object>(dtype));
    PyErr_Clear();
  }
  return raw.dtype_text;
}

bool read_int64(py::handle item, int64_t* value, bool* overflow) {
  PyObject* o = item.ptr();
  if (PyBool_Check(o) || !(PyLong_Check(o) || PyIndex_Check(o))) return false;
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(o));
  if (!index) {
    PyErr_Clear();
    return false;
  }
  int flag = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &flag);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  *overflow = flag != 0;
  *value = flag != 0 ? 0 : v;
  return true;
}

// ---- public ----

TensorView tensor_arg(py::handle obj, const char* name, const DTypeRequest& dtype, TensorArgOptions options) {
  if (obj.is_none()) throw TypeError(arg_prefix(name) + "expected a CUDA array, got None");
  RawArray raw;
  if (!read_cupy_ndarray(obj, &raw)) {
    raw = RawArray();
    read_any_array(obj, name, &raw);
  }
  TensorView view = check_raw(raw, name, dtype, options);
  if (options.check_device) check_on_current_device(&view, name);
  return view;
}

TensorView optional_tensor_arg(py::handle obj, const char* name, const DTypeRequest& dtype, TensorArgOptions options) {
  if (obj.is_none()) return TensorView{};
  return tensor_arg(obj, name, dtype, options);
}

void check_on_current_device(TensorView* view, const char* name) {
  if (view->defined() && view->data != nullptr) view->device = check_pointer_device(view->data, name);
}

void check_on_current_device(const TensorView& view, const char* name) {
  if (view.defined() && view.data != nullptr) check_pointer_device(view.data, name);
}

void check_extents(const char* name, const int64_t* shape, int ndim, int itemsize, bool int32_dims) {
  int64_t bytes = itemsize;
  bool overflow = false;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0) {
      throw ValueError(arg_prefix(name) + "negative dimension in shape " + shape_text(shape, ndim));
    }
    if (int32_dims && shape[i] > kInt32Max) {
      throw ValueError(arg_prefix(name) + "dimension " + std::to_string(i) + " of shape " + shape_text(shape, ndim) +
                       " is larger than " + std::to_string(kInt32Max) + ", the most cuDNN and the kernels take");
    }
  }
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] == 0) return;  // empty: no byte size to overflow
    overflow = overflow || __builtin_mul_overflow(bytes, shape[i], &bytes);
  }
  if (overflow) {
    throw ValueError(arg_prefix(name) + "shape " + shape_text(shape, ndim) + " has more bytes than fit in int64");
  }
}

std::string shape_text(const int64_t* shape, int ndim) {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (ndim == 1 ? ",)" : ")");
}

void check_shape(const TensorView& t, const char* name, const std::vector<int64_t>& expected, const char* why) {
  const bool same =
      static_cast<int>(expected.size()) == t.ndim && std::equal(expected.begin(), expected.end(), t.shape.begin());
  if (!same) {
    throw ValueError(arg_prefix(name) + "expected shape " + shape_text(expected.data(), int(expected.size())) +
                     (why ? std::string(" (") + why + ")" : std::string()) + ", got " + t.shape_str());
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

}  // namespace rn
