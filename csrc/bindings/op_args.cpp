#include "op_args.h"

#include <string>

#include "../core/device.h"
#include "../core/error.h"
#include "array_sources.h"
#include "output_alloc.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {

OpArgs::Entry& OpArgs::add(TensorView view, const char* name, py::handle obj) {
  entries_.push_back({view, name, py::reinterpret_borrow<py::object>(obj), false});
  return entries_.back();
}

const TensorView& OpArgs::input(py::handle obj, const char* name, const DTypeRequest& dtype, TensorArgOptions options) {
  options.check_device = false;
  return add(tensor_arg(obj, name, dtype, options), name, obj).view;
}

const TensorView& OpArgs::optional_input(py::handle obj, const char* name, const DTypeRequest& dtype,
                                         TensorArgOptions options) {
  options.check_device = false;
  return add(optional_tensor_arg(obj, name, dtype, options), name, obj).view;
}

const TensorView& OpArgs::output(py::handle obj, const char* name, DType dtype, const std::vector<int64_t>& shape,
                                 TensorArgOptions options) {
  if (!obj.is_none()) {
    options.writable = true;
    return input(obj, name, dtype, options);
  }
  TensorView view;
  view.dtype = dtype;
  view.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < view.ndim; ++i) view.shape[i] = shape[i];
  Entry& entry = add(view, name, obj);
  entry.pending = true;
  return entry.view;
}

const TensorView& OpArgs::optional_output(py::handle obj, const char* name, DType dtype, TensorArgOptions options) {
  options.writable = true;
  return optional_input(obj, name, dtype, options);
}

void OpArgs::fill(Entry& entry) {
  entry.object = new_device_array(shape_of(entry.view), entry.view.dtype, entry.name);
  // Just made by cupy on the current device: parsed for its pointer, with no device query.
  TensorArgOptions options;
  options.ndim = entry.view.ndim;
  options.check_device = false;
  entry.view = tensor_arg(entry.object, entry.name, entry.view.dtype, options);
  entry.view.device = current_device();
  entry.pending = false;
}

void OpArgs::prepare_device() {
  for (Entry& entry : entries_) {
    if (!entry.pending) check_on_current_device(&entry.view, entry.name);
  }
  for (Entry& entry : entries_) {
    if (entry.pending) fill(entry);
  }
}

const TensorView& OpArgs::allocate(const char* name, DType dtype, const std::vector<int64_t>& shape) {
  const TensorView& view = output(py::none(), name, dtype, shape);
  fill(entries_.back());
  return view;
}

py::object OpArgs::object(const TensorView& view) const {
  for (const Entry& entry : entries_) {
    if (&entry.view == &view) return view.defined() ? entry.object : py::none();
  }
  return py::none();
}

std::string OpArgs::describe(const void* self) {
  const auto* args = static_cast<const OpArgs*>(self);
  std::string text = std::string(args->op_) + "(";
  bool first = true;
  for (const Entry& entry : args->entries_) {
    if (!entry.view.defined()) continue;
    text += (first ? "" : ", ") + std::string(entry.name) + "=" + entry.view.describe();
    first = false;
  }
  if (!args->note_.empty()) text += (first ? "" : ", ") + args->note_;
  return text + ")";
}

std::vector<int64_t> shape_of(const TensorView& view) {
  return std::vector<int64_t>(view.shape.begin(), view.shape.begin() + view.ndim);
}

TensorArgOptions activation_options(Layout layout) {
  TensorArgOptions options;
  options.ndim = 4;
  options.int32_dims = true;
  options.dims = activation_dims(layout);
  return options;
}

bool overlaps(const TensorView& a, const TensorView& b) {
  if (!a.defined() || !b.defined() || a.data == nullptr || b.data == nullptr) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

void check_in_place_or_disjoint(const TensorView& out, const char* out_name, const TensorView& in,
                                const char* in_name) {
  const bool same = out.data == in.data && out.nbytes() == in.nbytes() && out.dtype == in.dtype;
  if (overlaps(out, in) && !same) {
    throw ValueError(std::string(out_name) + " partially overlaps " + in_name +
                     ": it must be the same array (in place) or not share memory with it");
  }
}

void check_disjoint(const TensorView& out, const char* out_name, std::initializer_list<NamedView> inputs) {
  for (const NamedView& in : inputs) {
    if (overlaps(out, in.view)) throw ValueError(std::string(out_name) + " must not share memory with " + in.name);
  }
}

// Whether a scalar argument is a device array (then parsed as one) rather than a number: it has a
// __cuda_array_interface__, or DLPack naming a CUDA device. Host arrays (NumPy 0-d arrays) are numbers.
bool is_device_array(py::handle obj) {
  if (py::hasattr(obj, "__cuda_array_interface__")) return true;
  if (!py::hasattr(obj, "__dlpack_device__")) return false;
  py::object device = obj.attr("__dlpack_device__")();
  int64_t type = -1;
  bool overflow = false;
  if (PyTuple_Check(device.ptr()) && PyTuple_GET_SIZE(device.ptr()) == 2) {
    read_int64(PyTuple_GET_ITEM(device.ptr(), 0), &type, &overflow);
  }
  return type == 2 || type == 13;  // kDLCUDA, kDLCUDAManaged
}

// A number, or a float32 device array of shape (1,) that the kernel reads (a Python float keeps no range check
// here: check_range / check_at_least do that for the arguments that have one).
kernels::ScalarArg scalar_arg(OpArgs& args, py::handle obj, const char* name) {
  kernels::ScalarArg s;
  if (is_device_array(obj)) {
    s.ptr = static_cast<const float*>(one_element_arg(args, obj, name, DType::F32, /*writable=*/false).data);
    return s;
  }
  const std::string expected = std::string(name) + ": expected a number or a float32 device array of shape (1,), got ";
  if (PyBool_Check(obj.ptr())) throw TypeError(expected + "a bool");
  try {
    s.value = static_cast<float>(number_arg(obj, name));
  } catch (const TypeError&) {
    throw TypeError(expected + std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  return s;
}

const TensorView& one_element_arg(OpArgs& args, py::handle obj, const char* name, DType dtype, bool writable) {
  if (obj.is_none()) {
    throw TypeError(std::string(name) + ": expected a cupy " + dtype_name(dtype) + " array of shape (1,), got None");
  }
  TensorArgOptions one_d;
  one_d.ndim = 1;
  one_d.writable = writable;
  const TensorView& v = args.input(obj, name, dtype, one_d);
  check_shape(v, name, {1});
  return v;
}

}  // namespace rn
