#include "value_args.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "../core/error.h"
#include "array_sources.h"

namespace py = pybind11;

namespace rn {
namespace {

std::string repr_text(py::handle obj) {
  return py::repr(obj);
}

// A double as Python prints it ("1.0", "-0.5", "inf").
std::string float_text(double value) {
  return py::repr(py::float_(value));
}

// A bound as Python's format(value, "g") prints it ("0", "1").
std::string bound_text(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

std::string type_name(py::handle obj) {
  return py::str(py::type::of(obj).attr("__name__"));
}

// A named enum of the bindings (resnet_native._C.Layout, DType): cast, or false when obj is something else.
template <typename Enum>
bool try_enum(py::handle obj, Enum* out) {
  py::detail::make_caster<Enum> caster;
  if (!caster.load(obj, /*convert=*/false)) return false;
  *out = py::detail::cast_op<Enum>(caster);
  return true;
}

}  // namespace

Layout layout_arg(py::handle obj) {
  Layout layout{};
  if (PyUnicode_Check(obj.ptr())) return parse_layout(py::str(obj));
  if (try_enum(obj, &layout)) return layout;
  throw ValueError("layout: expected 'NCHW' or 'NHWC', got " + repr_text(obj));
}

DTypeRequest dtype_arg(py::handle obj, bool uint16_is_bf16) {
  if (obj.is_none()) return DTypeRequest::infer(uint16_is_bf16);
  return exact_dtype_arg(obj);
}

DType exact_dtype_arg(py::handle obj) {
  DType dtype{};
  if (PyUnicode_Check(obj.ptr())) return parse_dtype(py::str(obj));
  if (try_enum(obj, &dtype) && dtype != DType::I32 && dtype != DType::U8) return dtype;
  throw ValueError("dtype: expected one of 'fp32', 'fp16', 'bf16', got " + repr_text(obj));
}

double number_arg(py::handle obj, const char* name) {
  if (PyFloat_Check(obj.ptr())) return PyFloat_AS_DOUBLE(obj.ptr());
  if (!PyUnicode_Check(obj.ptr()) && !PyBytes_Check(obj.ptr())) {
    const double value = PyFloat_AsDouble(obj.ptr());  // int, bool and anything with __float__ / __index__
    if (!(value == -1.0 && PyErr_Occurred())) return value;
    PyErr_Clear();
  }
  throw TypeError(arg_prefix(name) + "expected a number, got " + type_name(obj));
}

double eps_arg(py::handle obj) {
  const double eps = number_arg(obj, "eps");
  if (!(eps >= 0.0) || !std::isfinite(eps)) {
    throw ValueError("eps: expected a finite value >= 0, got " + float_text(eps));
  }
  return eps;
}

double check_range(double value, const char* name, double low, double high) {
  if (!(value >= low && value < high)) {
    throw ValueError(arg_prefix(name) + "expected a value in [" + bound_text(low) + ", " + bound_text(high) +
                     "), got " + float_text(value));
  }
  return value;
}

double check_at_least(double value, const char* name, double low) {
  if (!(value >= low)) {
    throw ValueError(arg_prefix(name) + "expected a value >= " + bound_text(low) + ", got " + float_text(value));
  }
  return value;
}

int int32_arg(py::handle obj, const char* name) {
  int64_t value = 0;
  bool overflow = false;
  if (!read_int64(obj, &value, &overflow)) throw TypeError(arg_prefix(name) + "expected an int, got " + repr_text(obj));
  if (overflow || value > std::numeric_limits<int32_t>::max() || value < std::numeric_limits<int32_t>::min()) {
    throw ValueError(arg_prefix(name) + repr_text(obj) + " is out of range (the limit is 2**31 - 1)");
  }
  return static_cast<int>(value);
}

int64_t int64_arg(py::handle obj, const char* name) {
  int64_t value = 0;
  bool overflow = false;
  if (!read_int64(obj, &value, &overflow)) throw TypeError(arg_prefix(name) + "expected an int, got " + type_name(obj));
  if (overflow) throw ValueError(arg_prefix(name) + repr_text(obj) + " is out of range (the limit is 2**63 - 1)");
  return value;
}

std::vector<int64_t> int64s_arg(py::handle obj, const char* name, int n) {
  if (!PySequence_Check(obj.ptr()) || PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) || py::len(obj) != n) {
    throw ValueError(arg_prefix(name) + "expected a tuple of " + std::to_string(n) + " ints, got " + repr_text(obj));
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  std::vector<int64_t> values(n);
  for (int i = 0; i < n; ++i) values[i] = int64_arg(seq[i], name);
  return values;
}

std::array<int, 2> int_pair_arg(py::handle obj, const char* name) {
  const std::string expected = arg_prefix(name) + "expected an int or a pair of ints, got " + repr_text(obj);
  if (PyBool_Check(obj.ptr())) throw TypeError(expected);
  int64_t value = 0;
  bool overflow = false;
  if (read_int64(obj, &value, &overflow)) {
    const int v = int32_arg(obj, name);
    return {v, v};
  }
  if (!PySequence_Check(obj.ptr())) throw TypeError(expected);
  if (py::len(obj) != 2) throw ValueError(expected);
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  std::array<int, 2> pair{};
  for (int i = 0; i < 2; ++i) {
    py::object item = seq[i];
    if (!read_int64(item, &value, &overflow)) throw ValueError(expected);
    pair[i] = int32_arg(item, name);
  }
  return pair;
}

std::vector<int64_t> shape_arg(py::handle obj, const char* name, int ndim, const char* dims, bool int32_dims) {
  if (!PyTuple_Check(obj.ptr()) && !PyList_Check(obj.ptr())) {
    throw TypeError(arg_prefix(name) + "expected a tuple of " + std::to_string(ndim) + " ints, got " + repr_text(obj));
  }
  const Py_ssize_t n = py::len(obj);
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  std::vector<int64_t> shape(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    bool overflow = false;
    if (!read_int64(seq[i], &shape[i], &overflow)) {
      throw TypeError(arg_prefix(name) + "expected a tuple of ints, got " + repr_text(obj));
    }
    if (overflow) throw ValueError(arg_prefix(name) + repr_text(obj) + ": an entry does not fit in int64");
  }
  if (n != ndim) {
    const std::string what = dims ? "activation (" + std::string(dims) + ")" : "shape";
    throw ValueError(arg_prefix(name) + "expected a " + std::to_string(ndim) + "-D " + what + ", got shape " +
                     shape_text(shape.data(), static_cast<int>(n)));
  }
  for (int64_t s : shape) {
    if (s < 1) throw ValueError(arg_prefix(name) + "expected positive sizes, got " + shape_text(shape.data(), ndim));
  }
  check_extents(name, shape.data(), ndim, 1, int32_dims);
  return shape;
}

const char* activation_dims(Layout layout) {
  return layout == Layout::NCHW ? "N, C, H, W" : "N, H, W, C";
}

std::array<int, 4> shape_nchw(const std::vector<int64_t>& shape, Layout layout) {
  TensorView view;  // only its shape, for nchw_dims
  view.ndim = 4;
  for (int i = 0; i < 4; ++i) view.shape[i] = shape[i];
  return nchw_dims(view, layout);
}

}  // namespace rn
