// Python bindings of the fully connected layer's kernels (kernels/linear.h; resnet_native/ops/linear.py wraps
// them): (N, C) features in fp32, fp16 or bf16 (a 16-bit integer array meaning bf16), fp32 weights (K, C), bias
// (K,), logits and their gradient (N, K). A missing output is allocated after validation and returned.
#include <pybind11/pybind11.h>

#include <string>

#include "../core/error.h"
#include "../kernels/linear.h"
#include "bindings.h"
#include "op_args.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace rn {
namespace {

const DTypeRequest kFeatures = DTypeRequest::infer(/*uint16_is_bf16=*/true);

// Once every argument is checked: the device stage, then the kernel, its errors naming the op's arguments.
template <typename Kernel>
py::object launch(OpArgs& args, const TensorView& out, Kernel&& kernel) {
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernel();
  return args.object(out);
}

// A (K, C) fp32 weight whose C matches the features' (those of the argument named `features_name`).
const TensorView& weight_arg(OpArgs& args, py::handle obj, int64_t features, const char* features_name) {
  const TensorView& w = args.input(obj, "w", DType::F32, rank(2));
  if (w.shape[1] != features) {
    throw ValueError(std::string("w: expected (K, ") + std::to_string(features) + ") to match " + features_name +
                     "'s features, got " + w.shape_str());
  }
  return w;
}

py::object forward_op(py::handle x_obj, py::handle w_obj, py::handle b_obj, py::handle out_obj, uintptr_t stream) {
  OpArgs args("linear_forward");
  const TensorView& x = args.input(x_obj, "x", kFeatures, rank(2));
  const TensorView& w = weight_arg(args, w_obj, x.shape[1], "x");
  const TensorView& b = args.input(b_obj, "b", DType::F32, rank(1));
  check_shape(b, "b", {w.shape[0]}, "one per output");
  const TensorView& out = args.output(out_obj, "out", DType::F32, {x.shape[0], w.shape[0]}, rank(2));
  check_shape(out, "out", {x.shape[0], w.shape[0]}, "(N, K)");
  check_disjoint(out, "out", {{x, "x"}, {w, "w"}, {b, "b"}});
  return launch(args, out, [&] { kernels::linear_forward(x, w, b, out, stream_arg(stream)); });
}

py::object backward_data_op(py::handle dy_obj, py::handle w_obj, py::handle out_obj, uintptr_t stream) {
  OpArgs args("linear_backward_data");
  const TensorView& dy = args.input(dy_obj, "dy", DType::F32, rank(2));
  TensorArgOptions writable = rank(2);
  writable.writable = true;
  const TensorView& out = args.input(out_obj, "out", kFeatures, writable);  // its dtype is the features'
  const TensorView& w = weight_arg(args, w_obj, out.shape[1], "out");
  check_shape(dy, "dy", {out.shape[0], w.shape[0]}, "(N, K) of out's N and w's K");
  check_disjoint(out, "out", {{dy, "dy"}, {w, "w"}});
  return launch(args, out, [&] { kernels::linear_backward_data(dy, w, out, stream_arg(stream)); });
}

py::object backward_weight_op(py::handle x_obj, py::handle dy_obj, py::handle out_obj, uintptr_t stream) {
  OpArgs args("linear_backward_weight");
  const TensorView& x = args.input(x_obj, "x", kFeatures, rank(2));
  const TensorView& dy = args.input(dy_obj, "dy", DType::F32, rank(2));
  if (dy.shape[0] != x.shape[0]) {
    throw ValueError("dy: expected " + std::to_string(x.shape[0]) + " rows, one per row of x, got " + dy.shape_str());
  }
  const TensorView& out = args.output(out_obj, "out", DType::F32, {dy.shape[1], x.shape[1]}, rank(2));
  check_shape(out, "out", {dy.shape[1], x.shape[1]}, "(K, C) of dy's K and x's C");
  check_disjoint(out, "out", {{x, "x"}, {dy, "dy"}});
  return launch(args, out, [&] { kernels::linear_backward_weight(x, dy, out, stream_arg(stream)); });
}

}  // namespace

void bind_linear(py::module_& m) {
  m.def("linear_forward", &forward_op, py::arg("x"), py::arg("w"), py::arg("b"), py::arg("out"), py::arg("stream"),
        "out[n, k] = b[k] + sum_c x[n, c] w[k, c] (fp32 sums); returns out");
  m.def("linear_backward_data", &backward_data_op, py::arg("dy"), py::arg("w"), py::arg("out"), py::arg("stream"),
        "out[n, c] = sum_k dy[n, k] w[k, c], in out's dtype; returns out");
  m.def("linear_backward_weight", &backward_weight_op, py::arg("x"), py::arg("dy"), py::arg("out"), py::arg("stream"),
        "out[k, c] = sum_n dy[n, k] x[n, c] (fp32 sums); returns out");
}

}  // namespace rn
