// Reads a DLPack capsule (__dlpack__ / __dlpack_device__) into a RawArray. The struct a capsule points to is
// the producer's, so nothing in it is trusted: the rank is range-checked before the shape is read, a NULL shape
// or a capsule of another kind is refused, and the versioned struct's flags (read-only, copied) are kept.
// The capsule is never consumed (not renamed "used_dltensor"): its own destructor calls the producer's deleter,
// and the producer object, alive in the caller, keeps the memory valid for the duration of the op.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "../core/error.h"
#include "array_sources.h"

namespace py = pybind11;

namespace rn {
namespace {

// The DLPack ABI (dmlc/dlpack dlpack.h), declared here for the fields we read.
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
struct DLManagedTensor {  // the unversioned capsule, "dltensor"
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {  // DLPack >= 1.0, "dltensor_versioned"
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint32_t kDLPackMajor = 1;
constexpr uint64_t kFlagReadOnly = 1ull << 0, kFlagIsCopied = 1ull << 1;
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4;

bool is_cuda_device(int32_t type) {
  return type == kDLCUDA || type == kDLCUDAManaged;
}

std::string dlpack_dtype_name(const DLDataType& t) {
  const std::string kind = t.code == kDLFloat    ? "float"
                           : t.code == kDLBfloat ? "bfloat"
                           : t.code == kDLInt    ? "int"
                           : t.code == kDLUInt   ? "uint"
                                                 : "code" + std::to_string(t.code) + "_";
  return kind + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

ElementKind dlpack_kind(const DLDataType& t) {
  if (t.lanes != 1) return ElementKind::Other;  // vector types (lanes > 1) are not arrays of scalars
  if (t.code == kDLFloat && t.bits == 32) return ElementKind::F32;
  if (t.code == kDLFloat && t.bits == 16) return ElementKind::F16;
  if (t.code == kDLBfloat && t.bits == 16) return ElementKind::BF16;
  if (t.code == kDLUInt && t.bits == 16) return ElementKind::U16;
  if (t.code == kDLInt && t.bits == 16) return ElementKind::I16;
  if (t.code == kDLInt && t.bits == 32) return ElementKind::I32;
  if (t.code == kDLUInt && t.bits == 8) return ElementKind::U8;
  if (t.code == kDLInt && t.bits == 8) return ElementKind::I8;
  if (t.code == kDLFloat && t.bits == 64) return ElementKind::F64;
  return ElementKind::Other;
}

// The device __dlpack_device__ reports; a TypeError for anything but CUDA memory.
void check_dlpack_device(py::handle obj, const char* name) {
  py::object dev = obj.attr("__dlpack_device__")();
  int64_t type = 0, id = 0;
  bool overflow = false;
  const bool pair = PyTuple_Check(dev.ptr()) && PyTuple_GET_SIZE(dev.ptr()) == 2 &&
                    read_int64(PyTuple_GET_ITEM(dev.ptr(), 0), &type, &overflow) &&
                    read_int64(PyTuple_GET_ITEM(dev.ptr(), 1), &id, &overflow) && !overflow;
  // Both are int32 in DLPack's DLDevice: a value outside that range names no device (and must not be truncated
  // into one: 2**32 + 2 is not kDLCUDA).
  if (!pair || type < INT32_MIN || type > INT32_MAX || id < 0 || id > INT32_MAX) {
    throw TypeError(arg_prefix(name) + "__dlpack_device__() must return (device_type, device_id), got " +
                    std::string(py::repr(dev)));
  }
  if (!is_cuda_device(static_cast<int32_t>(type))) {
    const bool host = type == kDLCPU || type == kDLCUDAHost;
    throw TypeError(arg_prefix(name) + "expected a CUDA array, got a " + module_type_name(obj) +
                    (host ? std::string(" in host memory (copy it with cupy.asarray)")
                          : " on DLPack device type " + std::to_string(type)));
  }
}

// obj.__dlpack__(max_version=(1, 1)): producers of DLPack >= 1.0 then give a versioned capsule, which says
// whether the memory is read-only. Older producers do not know the keyword (a TypeError): asked again without it.
py::object request_capsule(py::handle obj) {
  py::object method = obj.attr("__dlpack__");
  try {
    return method(py::arg("max_version") = py::make_tuple(kDLPackMajor, 1));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
  }
  return method();
}

}  // namespace

void read_dlpack(py::handle obj, const char* name, RawArray* raw) {
  check_dlpack_device(obj, name);
  const py::object capsule = request_capsule(obj);
  const DLTensor* t = nullptr;
  if (PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) {
    const auto* managed =
        static_cast<const DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"));
    if (managed->version.major != kDLPackMajor) {
      throw TypeError(arg_prefix(name) + "DLPack " + std::to_string(managed->version.major) + "." +
                      std::to_string(managed->version.minor) + " capsules are not supported (version 1.x is)");
    }
    raw->read_only = (managed->flags & kFlagReadOnly) != 0;
    raw->copied = (managed->flags & kFlagIsCopied) != 0;
    t = &managed->dl_tensor;
  } else if (PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    t = &static_cast<const DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"))->dl_tensor;
  } else {
    throw TypeError(arg_prefix(name) + "__dlpack__ did not return a 'dltensor' or 'dltensor_versioned' capsule");
  }
  if (!is_cuda_device(t->device.device_type)) {
    throw TypeError(arg_prefix(name) + "the DLPack tensor is on device type " + std::to_string(t->device.device_type) +
                    ", not the CUDA device __dlpack_device__ reports");
  }
  raw->kind = dlpack_kind(t->dtype);
  raw->itemsize = (t->dtype.bits / 8) * t->dtype.lanes;
  raw->dtype_text = dlpack_dtype_name(t->dtype);
  if (t->ndim < 0) throw ValueError(arg_prefix(name) + "the DLPack tensor has ndim " + std::to_string(t->ndim));
  if (t->ndim > TensorView::kMaxDims) {
    throw ValueError(arg_prefix(name) + "too many dimensions (" + std::to_string(t->ndim) + "; at most " +
                     std::to_string(TensorView::kMaxDims) + ")");
  }
  if (t->ndim > 0 && t->shape == nullptr) {
    throw ValueError(arg_prefix(name) + "the DLPack tensor has " + std::to_string(t->ndim) +
                     " dimensions but no shape");
  }
  raw->ndim = t->ndim;
  for (int i = 0; i < t->ndim; ++i) raw->shape[i] = t->shape[i];
  raw->has_strides = t->strides != nullptr;  // NULL: compact row-major
  raw->strides_in_bytes = false;
  for (int i = 0; raw->has_strides && i < t->ndim; ++i) raw->strides[i] = t->strides[i];
  const auto base = reinterpret_cast<uintptr_t>(t->data);
  if (base != 0 && t->byte_offset > UINTPTR_MAX - base) {
    throw ValueError(arg_prefix(name) + "the DLPack tensor's byte_offset " + std::to_string(t->byte_offset) +
                     " runs past the end of the address space");
  }
  // A NULL base with an offset is no address either: the validator refuses the NULL pointer.
  raw->data = base == 0 ? 0 : base + static_cast<uintptr_t>(t->byte_offset);
}

}  // namespace rn
