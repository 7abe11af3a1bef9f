// Python bindings of pooling: max pooling (cuDNN) and global average pooling (custom kernels);
// resnet_native/pool.py wraps them. Arguments come as Python gives them (kernel / stride / padding an int or a
// pair, stride None meaning the kernel, dtype None inferred from the first array); outputs not given are
// allocated after validation and returned.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <string>
#include <vector>

#include "../core/error.h"
#include "../pool/global_avg_pool.h"
#include "../pool/max_pool.h"
#include "bindings.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

using Nchw = std::array<int, 4>;

PoolWindow pool_window(py::handle kernel_obj, py::handle stride_obj, py::handle padding_obj) {
  PoolWindow w;
  w.kernel = int_pair_arg(kernel_obj, "kernel");
  w.stride = stride_obj.is_none() ? w.kernel : int_pair_arg(stride_obj, "stride");
  w.padding = int_pair_arg(padding_obj, "padding");
  for (int i = 0; i < 2; ++i) {
    if (w.kernel[i] < 1) throw ValueError("kernel: expected positive sizes, got " + std::to_string(w.kernel[i]));
    if (w.stride[i] < 1) throw ValueError("stride: expected positive values, got " + std::to_string(w.stride[i]));
    // PyTorch's rule: every window then holds at least one real element.
    if (w.padding[i] < 0 || w.padding[i] > w.kernel[i] / 2) {
      throw ValueError("padding: expected 0 <= padding <= kernel / 2, got padding " + std::to_string(w.padding[i]) +
                       " for kernel " + std::to_string(w.kernel[i]));
    }
  }
  return w;
}

// Our own output arithmetic (floor mode): clearer messages than cuDNN's, and no descriptor needed per call.
Nchw pool_output_nchw(const Nchw& x, const PoolWindow& w) {
  Nchw y{x[0], x[1], 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t extent = int64_t{x[2 + i]} + 2 * int64_t{w.padding[i]} - w.kernel[i];
    if (extent < 0) {
      throw ValueError("kernel: window " + std::to_string(w.kernel[i]) + " is larger than the padded input (" +
                       std::to_string(x[2 + i]) + " + 2 * " + std::to_string(w.padding[i]) + ")");
    }
    y[2 + i] = static_cast<int>(extent / w.stride[i] + 1);
  }
  return y;
}

std::vector<int64_t> stored_shape(const Nchw& nchw, Layout layout) {
  if (layout == Layout::NCHW) return {nchw[0], nchw[1], nchw[2], nchw[3]};
  return {nchw[0], nchw[2], nchw[3], nchw[1]};
}

std::string pool_note(Layout layout, const PoolWindow& w) {
  return std::string("layout=") + layout_name(layout) + ", kernel=(" + std::to_string(w.kernel[0]) + ", " +
         std::to_string(w.kernel[1]) + "), stride=(" + std::to_string(w.stride[0]) + ", " +
         std::to_string(w.stride[1]) + "), padding=(" + std::to_string(w.padding[0]) + ", " +
         std::to_string(w.padding[1]) + ")";
}

py::object max_pool2d_op(py::handle x_obj, py::handle out_obj, py::handle kernel_obj, py::handle stride_obj,
                         py::handle padding_obj, py::handle layout_obj, py::handle dtype_obj, uintptr_t stream) {
  const Layout layout = layout_arg(layout_obj);
  const DTypeRequest request = dtype_arg(dtype_obj);
  const PoolWindow window = pool_window(kernel_obj, stride_obj, padding_obj);
  OpArgs args("max_pool2d");
  const TensorView& x = args.input(x_obj, "x", request, activation_options(layout));
  const std::vector<int64_t> y_shape = stored_shape(pool_output_nchw(nchw_dims(x, layout), window), layout);
  const TensorView& out = args.output(out_obj, "out", x.dtype, y_shape, activation_options(layout));
  check_shape(out, "out", y_shape);
  check_disjoint(out, "out", {{x, "x"}});
  args.set_note(pool_note(layout, window));
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  max_pool2d_forward(x, out, window, layout, stream_arg(stream));
  return args.object(out);
}

py::object max_pool2d_backward_op(py::handle dy_obj, py::handle x_obj, py::handle y_obj, py::handle out_obj,
                                  py::handle kernel_obj, py::handle stride_obj, py::handle padding_obj,
                                  py::handle layout_obj, py::handle dtype_obj, uintptr_t stream) {
  const Layout layout = layout_arg(layout_obj);
  const DTypeRequest request = dtype_arg(dtype_obj);
  const PoolWindow window = pool_window(kernel_obj, stride_obj, padding_obj);
  OpArgs args("max_pool2d_backward");
  const TensorArgOptions activation = activation_options(layout);
  const TensorView& dy = args.input(dy_obj, "dy", request, activation);
  const TensorView& x = args.input(x_obj, "x", dy.dtype, activation);
  const TensorView& y = args.input(y_obj, "y", dy.dtype, activation);
  const TensorView& out = args.output(out_obj, "out", dy.dtype, shape_of(x), activation);
  const std::vector<int64_t> y_shape = stored_shape(pool_output_nchw(nchw_dims(x, layout), window), layout);
  check_shape(y, "y", y_shape);
  check_shape(dy, "dy", y_shape);
  check_same_shape(out, "out", x, "x");
  check_disjoint(out, "out", {{dy, "dy"}, {x, "x"}, {y, "y"}});
  args.set_note(pool_note(layout, window));
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  max_pool2d_backward(dy, x, y, out, window, layout, stream_arg(stream));
  return args.object(out);
}

TensorArgOptions two_d() {
  TensorArgOptions options;
  options.ndim = 2;
  options.int32_dims = true;
  return options;
}

py::object global_avg_pool_op(py::handle x_obj, py::handle out_obj, py::handle layout_obj, py::handle dtype_obj,
                              uintptr_t stream) {
  const Layout layout = layout_arg(layout_obj);
  const DTypeRequest request = dtype_arg(dtype_obj);
  OpArgs args("global_avg_pool");
  const TensorView& x = args.input(x_obj, "x", request, activation_options(layout));
  const Nchw d = nchw_dims(x, layout);
  const TensorView& out = args.output(out_obj, "out", x.dtype, {d[0], d[1]}, two_d());
  check_shape(out, "out", {d[0], d[1]});
  check_disjoint(out, "out", {{x, "x"}});
  args.set_note(std::string("layout=") + layout_name(layout));
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  global_avg_pool_forward(x, out, layout, stream_arg(stream));
  return args.object(out);
}

py::object global_avg_pool_backward_op(py::handle dy_obj, py::handle x_shape_obj, py::handle out_obj,
                                       py::handle layout_obj, py::handle dtype_obj, uintptr_t stream) {
  const Layout layout = layout_arg(layout_obj);
  const DTypeRequest request = dtype_arg(dtype_obj);
  OpArgs args("global_avg_pool_backward");
  const TensorView& dy = args.input(dy_obj, "dy", request, two_d());
  const std::vector<int64_t> x_shape = shape_arg(x_shape_obj, "x_shape", 4, activation_dims(layout), true);
  const TensorView& out = args.output(out_obj, "out", dy.dtype, x_shape, activation_options(layout));
  check_shape(out, "out", x_shape, "x_shape");
  const Nchw d = nchw_dims(out, layout);
  check_shape(dy, "dy", {d[0], d[1]});
  check_disjoint(out, "out", {{dy, "dy"}});
  args.set_note(std::string("layout=") + layout_name(layout));
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  global_avg_pool_backward(dy, out, layout, stream_arg(stream));
  return args.object(out);
}

py::tuple max_pool2d_output_shape_op(py::handle x_shape_obj, py::handle kernel_obj, py::handle stride_obj,
                                     py::handle padding_obj, py::handle layout_obj) {
  const Layout layout = layout_arg(layout_obj);
  const std::vector<int64_t> s = shape_arg(x_shape_obj, "x_shape", 4, activation_dims(layout), true);
  const PoolWindow window = pool_window(kernel_obj, stride_obj, padding_obj);
  const Nchw x = shape_nchw(s, layout);
  pool_output_nchw(x, window);  // our own range checks first: clearer messages than cuDNN's
  const std::vector<int64_t> stored = stored_shape(max_pool2d_output_dims(x, window, DType::F32, layout), layout);
  return py::make_tuple(stored[0], stored[1], stored[2], stored[3]);
}

}  // namespace

void bind_pool(py::module_& m) {
  m.def("max_pool2d", &max_pool2d_op, py::arg("x"), py::arg("out"), py::arg("kernel"), py::arg("stride"),
        py::arg("padding"), py::arg("layout"), py::arg("dtype"), py::arg("stream"), "Returns out.");
  m.def("max_pool2d_backward", &max_pool2d_backward_op, py::arg("dy"), py::arg("x"), py::arg("y"), py::arg("out"),
        py::arg("kernel"), py::arg("stride"), py::arg("padding"), py::arg("layout"), py::arg("dtype"),
        py::arg("stream"), "Returns out (dx).");
  m.def("max_pool2d_output_dims", &max_pool2d_output_shape_op, py::arg("x_shape"), py::arg("kernel"), py::arg("stride"),
        py::arg("padding"), py::arg("layout"),
        "Output shape (in the layout's order) as cuDNN computes it; needs no GPU.");
  m.def("global_avg_pool", &global_avg_pool_op, py::arg("x"), py::arg("out"), py::arg("layout"), py::arg("dtype"),
        py::arg("stream"), "Returns out, (N, C).");
  m.def("global_avg_pool_backward", &global_avg_pool_backward_op, py::arg("dy"), py::arg("x_shape"), py::arg("out"),
        py::arg("layout"), py::arg("dtype"), py::arg("stream"), "Returns out (dx, of x_shape).");
}

}  // namespace rn
