// Python bindings of the custom elementwise kernels of the residual blocks, dtype conversion and the
// cudnnAddTensor baseline (resnet_native/kernels.py wraps them). Each op takes its arguments as Python gives
// them: dtype None infers the dtype from the first array, a missing `out` is allocated (after validation) and
// returned.
#include <pybind11/pybind11.h>

#include <cfloat>
#include <cmath>
#include <string>

#include "../core/error.h"
#include "../kernels/add_tensor_cudnn.h"
#include "../kernels/cast.h"
#include "../kernels/elementwise.h"
#include "bindings.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

enum class Binary { Add, AddRelu, ReluBackward };

// The Python names of a binary op's operands: add / add_relu take (a, b), the ReLU mask (dy, y).
struct OperandNames {
  const char* first;
  const char* second;
};

OperandNames operand_names(Binary kind) {
  return kind == Binary::ReluBackward ? OperandNames{"dy", "y"} : OperandNames{"a", "b"};
}

// out = op(first, second).
py::object binary_op(const char* op, Binary kind, py::handle first_obj, py::handle second_obj, py::handle out_obj,
                     py::handle dtype_obj, uintptr_t stream) {
  const DTypeRequest request = dtype_arg(dtype_obj);
  const bool mask = kind == Binary::ReluBackward;
  const auto [first_name, second_name] = operand_names(kind);
  OpArgs args(op);
  const TensorView& first = args.input(first_obj, first_name, request);
  const TensorView& second = args.input(second_obj, second_name, first.dtype);
  const TensorView& out = args.output(out_obj, "out", first.dtype, shape_of(first));
  check_same_shape(first, first_name, second, second_name);
  check_same_shape(out, "out", first, first_name);
  check_in_place_or_disjoint(out, "out", first, first_name);
  check_in_place_or_disjoint(out, "out", second, second_name);
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  if (mask) {
    kernels::relu_backward(first, second, out, stream_arg(stream));
  } else {
    kernels::add(first, second, out, kind == Binary::AddRelu, stream_arg(stream));
  }
  return args.object(out);
}

// A weight the kernels multiply by in fp32: a finite number within float's range.
float alpha_arg(py::handle obj) {
  const double alpha = number_arg(obj, "alpha");
  if (!std::isfinite(alpha) || std::fabs(alpha) > FLT_MAX) {
    throw ValueError("alpha: expected a finite number within float32's range, got " + std::to_string(alpha));
  }
  return static_cast<float>(alpha);
}

// out = a + alpha * b.
py::object add_scaled_op(py::handle a_obj, py::handle b_obj, py::handle alpha_obj, py::handle out_obj,
                         py::handle dtype_obj, uintptr_t stream) {
  const float alpha = alpha_arg(alpha_obj);
  const DTypeRequest request = dtype_arg(dtype_obj);
  OpArgs args("add_scaled");
  const TensorView& a = args.input(a_obj, "a", request);
  const TensorView& b = args.input(b_obj, "b", a.dtype);
  const TensorView& out = args.output(out_obj, "out", a.dtype, shape_of(a));
  check_same_shape(a, "a", b, "b");
  check_same_shape(out, "out", a, "a");
  check_in_place_or_disjoint(out, "out", a, "a");
  check_in_place_or_disjoint(out, "out", b, "b");
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::add_scaled(a, b, alpha, out, stream_arg(stream));
  return args.object(out);
}

// What the one-input ops do once x and out are parsed: out checked against x (same shape; in place or disjoint),
// the device check (which allocates a missing out), then run() in the op's error context; returns out.
template <typename Run>
py::object finish_unary(OpArgs& args, const TensorView& x, const TensorView& out, Run&& run) {
  check_same_shape(out, "out", x, "x");
  check_in_place_or_disjoint(out, "out", x, "x");
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  run();
  return args.object(out);
}

py::object relu_op(py::handle x_obj, py::handle out_obj, py::handle dtype_obj, uintptr_t stream) {
  const DTypeRequest request = dtype_arg(dtype_obj);
  OpArgs args("relu");
  const TensorView& x = args.input(x_obj, "x", request);
  const TensorView& out = args.output(out_obj, "out", x.dtype, shape_of(x));
  return finish_unary(args, x, out, [&] { kernels::relu(x, out, stream_arg(stream)); });
}

py::object scale_op(py::handle x_obj, py::handle alpha_obj, py::handle out_obj, py::handle dtype_obj,
                    uintptr_t stream) {
  const float alpha = alpha_arg(alpha_obj);
  const DTypeRequest request = dtype_arg(dtype_obj);
  OpArgs args("scale");
  const TensorView& x = args.input(x_obj, "x", request);
  const TensorView& out = args.output(out_obj, "out", x.dtype, shape_of(x));
  return finish_unary(args, x, out, [&] { kernels::scale(x, alpha, out, stream_arg(stream)); });
}

// Both dtypes inferred, a 16-bit integer array meaning bf16 (cast's only use of one).
py::object cast_op(py::handle x_obj, py::handle out_obj, bool accumulate, uintptr_t stream) {
  OpArgs args("cast");
  const TensorView& x = args.input(x_obj, "x", DTypeRequest::infer(/*uint16_is_bf16=*/true));
  TensorArgOptions writable;
  writable.writable = true;
  const TensorView& out = args.input(out_obj, "out", DTypeRequest::infer(/*uint16_is_bf16=*/true), writable);
  return finish_unary(args, x, out, [&] { kernels::cast(x, out, accumulate, stream_arg(stream)); });
}

py::object add_tensor_cudnn_op(py::handle a_obj, py::handle b_obj, py::handle out_obj, py::handle layout_obj,
                               py::handle dtype_obj, uintptr_t stream) {
  const Layout layout = layout_arg(layout_obj);
  const DTypeRequest request = dtype_arg(dtype_obj);
  TensorArgOptions four_d;  // cuDNN's 4-D descriptors: rank 4, every dimension an int
  four_d.ndim = 4;
  four_d.int32_dims = true;
  OpArgs args("add_tensor_cudnn");
  const TensorView& a = args.input(a_obj, "a", request, four_d);
  const TensorView& b = args.input(b_obj, "b", a.dtype, four_d);
  const TensorView& out = args.output(out_obj, "out", a.dtype, shape_of(a), four_d);
  check_same_shape(a, "a", b, "b");
  check_same_shape(out, "out", a, "a");
  check_in_place_or_disjoint(out, "out", a, "a");
  check_in_place_or_disjoint(out, "out", b, "b");
  args.set_note(std::string("layout=") + layout_name(layout));
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::add_tensor_cudnn(a, b, out, layout, stream_arg(stream));
  return args.object(out);
}

// The binding of one binary op: (first, second, out, dtype, stream), the operands named by operand_names().
void def_binary(py::module_& m, const char* name, Binary kind, const char* doc) {
  m.def(
      name,
      [name, kind](py::handle first, py::handle second, py::handle out, py::handle dtype, uintptr_t stream) {
        return binary_op(name, kind, first, second, out, dtype, stream);
      },
      py::arg(operand_names(kind).first), py::arg(operand_names(kind).second), py::arg("out"), py::arg("dtype"),
      py::arg("stream"), doc);
}

}  // namespace

void bind_kernels(py::module_& m) {
  def_binary(m, "add", Binary::Add, "out = a + b; returns out");
  def_binary(m, "add_relu", Binary::AddRelu, "out = max(a + b, 0); returns out");
  def_binary(m, "relu_backward", Binary::ReluBackward, "out = dy * (y > 0); returns out");
  m.def("relu", &relu_op, py::arg("x"), py::arg("out"), py::arg("dtype"), py::arg("stream"),
        "out = max(x, 0); returns out");
  m.def("add_scaled", &add_scaled_op, py::arg("a"), py::arg("b"), py::arg("alpha"), py::arg("out"), py::arg("dtype"),
        py::arg("stream"), "out = a + alpha * b (fp32 math, one rounding); returns out");
  m.def("scale", &scale_op, py::arg("x"), py::arg("alpha"), py::arg("out"), py::arg("dtype"), py::arg("stream"),
        "out = alpha * x; returns out");
  m.def("cast", &cast_op, py::arg("x"), py::arg("out"), py::arg("accumulate"), py::arg("stream"),
        "out = x converted to out's dtype, or out += x (accumulate), rounded to nearest even; returns out");
  m.def("add_tensor_cudnn", &add_tensor_cudnn_op, py::arg("a"), py::arg("b"), py::arg("out"), py::arg("layout"),
        py::arg("dtype"), py::arg("stream"), "out = a + b through cudnnAddTensor; returns out");
}

}  // namespace rn
