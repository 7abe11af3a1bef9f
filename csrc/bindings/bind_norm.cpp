// Python bindings of the layer ops around the convolutions: batch normalization (cuDNN, with the fused
// BN + add + ReLU path), max pooling (cuDNN) and global average pooling (custom kernels).
// resnet_native/norm.py and resnet_native/pool.py wrap these; they allocate outputs before calling.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <string>

#include "../core/error.h"
#include "../kernels/op_args.h"
#include "../norm/batch_norm.h"
#include "../pool/global_avg_pool.h"
#include "../pool/max_pool.h"
#include "bindings.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace rn {
namespace {

int channels(const TensorView& x, Layout layout) {
  return nchw_dims(x, layout)[1];
}

// gamma, beta and the statistics: fp32 (C,).
const TensorView& param_arg(OpArgs& args, py::handle obj, const char* name, int c) {
  const TensorView& v = args.array(obj, name, DType::F32, 1);
  check_shape(v, name, {c});
  return v;
}

void check_eps(double eps) {
  if (!(eps >= 0.0) || !std::isfinite(eps)) {
    throw ValueError("eps: expected a finite value >= 0, got " + std::to_string(eps));
  }
}

std::string bn_note(const std::string& layout, bool relu) {
  return "layout=" + layout + (relu ? ", relu" : "");
}

void batch_norm_train_op(py::handle x_obj, py::handle gamma_obj, py::handle beta_obj, py::handle running_mean_obj,
                         py::handle running_var_obj, py::handle z_obj, py::handle out_obj, py::handle save_mean_obj,
                         py::handle save_invstd_obj, py::handle reserve_obj, const std::string& layout_name,
                         const std::string& dtype_name, double momentum, double eps, bool relu, uintptr_t stream) {
  BatchNormTrainArgs a;
  a.layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  if (!(momentum >= 0.0 && momentum <= 1.0)) {
    throw ValueError("momentum: expected a value in [0, 1], got " + std::to_string(momentum));
  }
  check_eps(eps);
  a.momentum = momentum;
  a.eps = eps;
  a.relu = relu;
  OpArgs args("batch_norm_train");
  a.x = args.array(x_obj, "x", dtype, 4);
  const int c = channels(a.x, a.layout);
  a.gamma = param_arg(args, gamma_obj, "gamma", c);
  a.beta = param_arg(args, beta_obj, "beta", c);
  a.running_mean = param_arg(args, running_mean_obj, "running_mean", c);
  a.running_var = param_arg(args, running_var_obj, "running_var", c);
  a.save_mean = param_arg(args, save_mean_obj, "save_mean", c);
  a.save_invstd = param_arg(args, save_invstd_obj, "save_invstd", c);
  a.z = args.optional(z_obj, "z", dtype, 4);
  a.y = args.array(out_obj, "out", dtype, 4);
  a.reserve = args.optional(reserve_obj, "reserve", DType::F32, 1);
  if (a.z.defined()) check_same_shape(a.z, "z", a.x, "x");
  check_same_shape(a.y, "out", a.x, "x");
  check_disjoint(a.y, "out", a.x, "x");
  check_disjoint(a.y, "out", a.z, "z");
  check_disjoint(a.save_mean, "save_mean", a.save_invstd, "save_invstd");
  check_disjoint(a.running_mean, "running_mean", a.running_var, "running_var");
  args.set_note(bn_note(layout_name, relu));
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  batch_norm_forward_training(a, stream_arg(stream));
}

void batch_norm_infer_op(py::handle x_obj, py::handle gamma_obj, py::handle beta_obj, py::handle running_mean_obj,
                         py::handle running_var_obj, py::handle z_obj, py::handle out_obj,
                         const std::string& layout_name, const std::string& dtype_name, double eps, bool relu,
                         uintptr_t stream) {
  BatchNormInferArgs a;
  a.layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  check_eps(eps);
  a.eps = eps;
  a.relu = relu;
  OpArgs args("batch_norm_infer");
  a.x = args.array(x_obj, "x", dtype, 4);
  const int c = channels(a.x, a.layout);
  a.gamma = param_arg(args, gamma_obj, "gamma", c);
  a.beta = param_arg(args, beta_obj, "beta", c);
  a.running_mean = param_arg(args, running_mean_obj, "running_mean", c);
  a.running_var = param_arg(args, running_var_obj, "running_var", c);
  a.z = args.optional(z_obj, "z", dtype, 4);
  a.y = args.array(out_obj, "out", dtype, 4);
  if (a.z.defined()) check_same_shape(a.z, "z", a.x, "x");
  check_same_shape(a.y, "out", a.x, "x");
  check_disjoint(a.y, "out", a.x, "x");
  check_disjoint(a.y, "out", a.z, "z");
  args.set_note(bn_note(layout_name, relu));
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  batch_norm_forward_inference(a, stream_arg(stream));
}

void batch_norm_backward_op(py::handle x_obj, py::handle dy_obj, py::handle y_obj, py::handle gamma_obj,
                            py::handle beta_obj, py::handle save_mean_obj, py::handle save_invstd_obj,
                            py::handle reserve_obj, py::handle dx_obj, py::handle dgamma_obj, py::handle dbeta_obj,
                            py::handle dz_obj, const std::string& layout_name, const std::string& dtype_name,
                            double eps, bool relu, bool has_z, bool accumulate, uintptr_t stream) {
  BatchNormBackwardArgs a;
  a.layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  check_eps(eps);
  a.eps = eps;
  a.relu = relu;
  a.has_z = has_z;
  a.accumulate = accumulate;
  OpArgs args("batch_norm_backward");
  a.x = args.array(x_obj, "x", dtype, 4);
  const int c = channels(a.x, a.layout);
  a.dy = args.array(dy_obj, "dy", dtype, 4);
  a.y = args.optional(y_obj, "y", dtype, 4);
  a.gamma = param_arg(args, gamma_obj, "gamma", c);
  a.beta = param_arg(args, beta_obj, "beta", c);
  a.save_mean = param_arg(args, save_mean_obj, "save_mean", c);
  a.save_invstd = param_arg(args, save_invstd_obj, "save_invstd", c);
  a.reserve = args.optional(reserve_obj, "reserve", DType::F32, 1);
  a.dx = args.array(dx_obj, "dx", dtype, 4);
  a.dgamma = param_arg(args, dgamma_obj, "dgamma", c);
  a.dbeta = param_arg(args, dbeta_obj, "dbeta", c);
  a.dz = args.optional(dz_obj, "dz", dtype, 4);
  check_same_shape(a.dy, "dy", a.x, "x");
  check_same_shape(a.dx, "dx", a.x, "x");
  if (relu && !a.y.defined()) throw ValueError("y: the forward output is required with relu=True (the ReLU mask)");
  if (a.y.defined()) check_same_shape(a.y, "y", a.x, "x");
  if (has_z && !a.dz.defined()) throw ValueError("dz: required with has_z=True");
  if (!has_z && a.dz.defined()) throw ValueError("dz: given but has_z is False");
  if (a.dz.defined()) check_same_shape(a.dz, "dz", a.x, "x");
  check_disjoint(a.dx, "dx", a.x, "x");
  check_disjoint(a.dx, "dx", a.dy, "dy");
  check_disjoint(a.dx, "dx", a.y, "y");
  check_disjoint(a.dz, "dz", a.dx, "dx");
  check_disjoint(a.dz, "dz", a.dy, "dy");
  check_disjoint(a.dz, "dz", a.y, "y");
  check_disjoint(a.dgamma, "dgamma", a.dbeta, "dbeta");
  args.set_note(bn_note(layout_name, relu) + (has_z ? ", has_z" : ""));
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  batch_norm_backward(a, stream_arg(stream));
}

// ---- pooling ----

PoolWindow pool_window(const std::array<int, 2>& kernel, const std::array<int, 2>& stride,
                       const std::array<int, 2>& padding) {
  for (int i = 0; i < 2; ++i) {
    if (kernel[i] < 1) throw ValueError("kernel: expected positive sizes, got " + std::to_string(kernel[i]));
    if (stride[i] < 1) throw ValueError("stride: expected positive values, got " + std::to_string(stride[i]));
    // PyTorch's rule: every window then holds at least one real element.
    if (padding[i] < 0 || padding[i] > kernel[i] / 2) {
      throw ValueError("padding: expected 0 <= padding <= kernel / 2, got padding " + std::to_string(padding[i]) +
                       " for kernel " + std::to_string(kernel[i]));
    }
  }
  return {kernel, stride, padding};
}

std::array<int, 4> pool_output_nchw(const std::array<int, 4>& x, const PoolWindow& w) {
  std::array<int, 4> y{x[0], x[1], 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int extent = x[2 + i] + 2 * w.padding[i] - w.kernel[i];
    if (extent < 0) {
      throw ValueError("kernel: window " + std::to_string(w.kernel[i]) + " is larger than the padded input (" +
                       std::to_string(x[2 + i]) + " + 2 * " + std::to_string(w.padding[i]) + ")");
    }
    y[2 + i] = extent / w.stride[i] + 1;
  }
  return y;
}

std::array<int64_t, 4> stored_shape(const std::array<int, 4>& nchw, Layout layout) {
  if (layout == Layout::NCHW) return {nchw[0], nchw[1], nchw[2], nchw[3]};
  return {nchw[0], nchw[2], nchw[3], nchw[1]};
}

void check_stored_shape(const TensorView& v, const char* name, const std::array<int, 4>& nchw, Layout layout) {
  const auto s = stored_shape(nchw, layout);
  check_shape(v, name, {s[0], s[1], s[2], s[3]});
}

std::string pool_note(const std::string& layout, const PoolWindow& w) {
  return "layout=" + layout + ", kernel=(" + std::to_string(w.kernel[0]) + ", " + std::to_string(w.kernel[1]) +
         "), stride=(" + std::to_string(w.stride[0]) + ", " + std::to_string(w.stride[1]) + "), padding=(" +
         std::to_string(w.padding[0]) + ", " + std::to_string(w.padding[1]) + ")";
}

void max_pool2d_op(py::handle x_obj, py::handle out_obj, const std::array<int, 2>& kernel,
                   const std::array<int, 2>& stride, const std::array<int, 2>& padding, const std::string& layout_name,
                   const std::string& dtype_name, uintptr_t stream) {
  const Layout layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  const PoolWindow window = pool_window(kernel, stride, padding);
  OpArgs args("max_pool2d");
  const TensorView& x = args.array(x_obj, "x", dtype, 4);
  const TensorView& out = args.array(out_obj, "out", dtype, 4);
  check_stored_shape(out, "out", pool_output_nchw(nchw_dims(x, layout), window), layout);
  check_disjoint(out, "out", x, "x");
  args.set_note(pool_note(layout_name, window));
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  max_pool2d_forward(x, out, window, layout, stream_arg(stream));
}

void max_pool2d_backward_op(py::handle dy_obj, py::handle x_obj, py::handle y_obj, py::handle out_obj,
                            const std::array<int, 2>& kernel, const std::array<int, 2>& stride,
                            const std::array<int, 2>& padding, const std::string& layout_name,
                            const std::string& dtype_name, uintptr_t stream) {
  const Layout layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  const PoolWindow window = pool_window(kernel, stride, padding);
  OpArgs args("max_pool2d_backward");
  const TensorView& dy = args.array(dy_obj, "dy", dtype, 4);
  const TensorView& x = args.array(x_obj, "x", dtype, 4);
  const TensorView& y = args.array(y_obj, "y", dtype, 4);
  const TensorView& out = args.array(out_obj, "out", dtype, 4);
  const auto y_nchw = pool_output_nchw(nchw_dims(x, layout), window);
  check_stored_shape(y, "y", y_nchw, layout);
  check_stored_shape(dy, "dy", y_nchw, layout);
  check_same_shape(out, "out", x, "x");
  check_disjoint(out, "out", dy, "dy");
  check_disjoint(out, "out", x, "x");
  check_disjoint(out, "out", y, "y");
  args.set_note(pool_note(layout_name, window));
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  max_pool2d_backward(dy, x, y, out, window, layout, stream_arg(stream));
}

void global_avg_pool_op(py::handle x_obj, py::handle out_obj, const std::string& layout_name,
                        const std::string& dtype_name, uintptr_t stream) {
  const Layout layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  OpArgs args("global_avg_pool");
  const TensorView& x = args.array(x_obj, "x", dtype, 4);
  const TensorView& out = args.array(out_obj, "out", dtype, 2);
  const auto d = nchw_dims(x, layout);
  check_shape(out, "out", {d[0], d[1]});
  check_disjoint(out, "out", x, "x");
  args.set_note("layout=" + layout_name);
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  global_avg_pool_forward(x, out, layout, stream_arg(stream));
}

void global_avg_pool_backward_op(py::handle dy_obj, py::handle out_obj, const std::string& layout_name,
                                 const std::string& dtype_name, uintptr_t stream) {
  const Layout layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  OpArgs args("global_avg_pool_backward");
  const TensorView& dy = args.array(dy_obj, "dy", dtype, 2);
  const TensorView& out = args.array(out_obj, "out", dtype, 4);
  const auto d = nchw_dims(out, layout);
  check_shape(dy, "dy", {d[0], d[1]});
  check_disjoint(out, "out", dy, "dy");
  args.set_note("layout=" + layout_name);
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  global_avg_pool_backward(dy, out, layout, stream_arg(stream));
}

BatchNormModePolicy parse_mode_policy(const std::string& name) {
  if (name == "auto") return BatchNormModePolicy::Auto;
  if (name == "persistent") return BatchNormModePolicy::Persistent;
  if (name == "spatial") return BatchNormModePolicy::Spatial;
  throw ValueError("mode: expected 'auto', 'persistent' or 'spatial', got '" + name + "'");
}

const char* mode_policy_name(BatchNormModePolicy policy) {
  switch (policy) {
    case BatchNormModePolicy::Persistent:
      return "persistent";
    case BatchNormModePolicy::Spatial:
      return "spatial";
    case BatchNormModePolicy::Auto:
      break;
  }
  return "auto";
}

std::array<int, 4> nchw_of_shape(const std::array<int64_t, 4>& shape, Layout layout) {
  for (int64_t s : shape) {
    if (s < 1) throw ValueError("x_shape: expected positive sizes");
  }
  if (layout == Layout::NCHW) return {int(shape[0]), int(shape[1]), int(shape[2]), int(shape[3])};
  return {int(shape[0]), int(shape[3]), int(shape[1]), int(shape[2])};
}

}  // namespace

void bind_norm(py::module_& m) {
  m.def("batch_norm_train", &batch_norm_train_op, py::arg("x"), py::arg("gamma"), py::arg("beta"),
        py::arg("running_mean"), py::arg("running_var"), py::arg("z"), py::arg("out"), py::arg("save_mean"),
        py::arg("save_invstd"), py::arg("reserve"), py::arg("layout"), py::arg("dtype"), py::arg("momentum"),
        py::arg("eps"), py::arg("relu"), py::arg("stream"));
  m.def("batch_norm_infer", &batch_norm_infer_op, py::arg("x"), py::arg("gamma"), py::arg("beta"),
        py::arg("running_mean"), py::arg("running_var"), py::arg("z"), py::arg("out"), py::arg("layout"),
        py::arg("dtype"), py::arg("eps"), py::arg("relu"), py::arg("stream"));
  m.def("batch_norm_backward", &batch_norm_backward_op, py::arg("x"), py::arg("dy"), py::arg("y"), py::arg("gamma"),
        py::arg("beta"), py::arg("save_mean"), py::arg("save_invstd"), py::arg("reserve"), py::arg("dx"),
        py::arg("dgamma"), py::arg("dbeta"), py::arg("dz"), py::arg("layout"), py::arg("dtype"), py::arg("eps"),
        py::arg("relu"), py::arg("has_z"), py::arg("accumulate"), py::arg("stream"));
  m.def(
      "batch_norm_reserve_size",
      [](const std::array<int64_t, 4>& x_shape, const std::string& layout_name, const std::string& dtype_name,
         bool relu, bool has_z, uintptr_t stream) {
        const Layout layout = parse_layout(layout_name);
        return batch_norm_reserve_size(layout, parse_dtype(dtype_name), nchw_of_shape(x_shape, layout), relu, has_z,
                                       stream_arg(stream));
      },
      py::arg("x_shape"), py::arg("layout"), py::arg("dtype"), py::arg("relu"), py::arg("has_z"), py::arg("stream"),
      "Bytes of reserve space batch_norm_train needs (0: none).");
  m.def("batch_norm_last_path", [] {
    const BatchNormPath p = batch_norm_last_path();
    py::dict d;
    d["op"] = p.op;
    d["fused"] = p.fused;
    d["mode"] = p.mode;
    d["detail"] = p.detail;
    return d;
  });
  m.def(
      "set_batch_norm_mode", [](const std::string& mode) { set_batch_norm_mode_policy(parse_mode_policy(mode)); },
      py::arg("mode"));
  m.def("batch_norm_mode", [] { return std::string(mode_policy_name(batch_norm_mode_policy())); });
  m.def("set_batch_norm_fuse_bf16", &set_batch_norm_fuse_bf16, py::arg("enabled"));
  m.def("batch_norm_fuse_bf16", &batch_norm_fuse_bf16);
  m.def("clear_batch_norm_refusals", &clear_batch_norm_refusals);

  m.def("max_pool2d", &max_pool2d_op, py::arg("x"), py::arg("out"), py::arg("kernel"), py::arg("stride"),
        py::arg("padding"), py::arg("layout"), py::arg("dtype"), py::arg("stream"));
  m.def("max_pool2d_backward", &max_pool2d_backward_op, py::arg("dy"), py::arg("x"), py::arg("y"), py::arg("out"),
        py::arg("kernel"), py::arg("stride"), py::arg("padding"), py::arg("layout"), py::arg("dtype"),
        py::arg("stream"));
  m.def(
      "max_pool2d_output_dims",
      [](const std::array<int64_t, 4>& x_shape, const std::array<int, 2>& kernel, const std::array<int, 2>& stride,
         const std::array<int, 2>& padding, const std::string& layout_name) {
        const Layout layout = parse_layout(layout_name);
        const PoolWindow window = pool_window(kernel, stride, padding);
        const auto nchw = nchw_of_shape(x_shape, layout);
        pool_output_nchw(nchw, window);  // our own range checks first: clearer messages than cuDNN's
        const auto y = max_pool2d_output_dims(nchw, window, DType::F32, layout);
        return stored_shape(y, layout);
      },
      py::arg("x_shape"), py::arg("kernel"), py::arg("stride"), py::arg("padding"), py::arg("layout"),
      "Output shape (in the layout's order) as cuDNN computes it; needs no GPU.");
  m.def("global_avg_pool", &global_avg_pool_op, py::arg("x"), py::arg("out"), py::arg("layout"), py::arg("dtype"),
        py::arg("stream"));
  m.def("global_avg_pool_backward", &global_avg_pool_backward_op, py::arg("dy"), py::arg("out"), py::arg("layout"),
        py::arg("dtype"), py::arg("stream"));
}

}  // namespace rn
