// Python bindings of batch normalization (cuDNN, with the fused BN + add + ReLU path); resnet_native/norm.py
// wraps them. Arguments come as Python gives them (dtype None: inferred from x); outputs not given (out, the
// saved statistics, the gradients, and the reserve space the fused path needs, sized by cuDNN) are allocated
// after validation and returned.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "../core/error.h"
#include "../norm/batch_norm.h"
#include "../norm/sync_batch_norm.h"
#include "bindings.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

// What every batch-norm op starts from: its settings and x, which fixes the dtype and C.
struct BnInput {
  Layout layout;
  TensorView x;
  int64_t c;
};

BnInput bn_input(OpArgs& args, py::handle x_obj, Layout layout, py::handle dtype_obj) {
  const DTypeRequest request = dtype_arg(dtype_obj);
  const TensorView& x = args.input(x_obj, "x", request, activation_options(layout));
  return {layout, x, nchw_dims(x, layout)[1]};
}

TensorArgOptions one_d(bool writable = false) {
  TensorArgOptions options;
  options.ndim = 1;
  options.writable = writable;
  return options;
}

// gamma, beta and the statistics: fp32 (C,); `written` for the ones the op updates in place.
const TensorView& channel_param(OpArgs& args, py::handle obj, const char* name, int64_t c, bool written = false) {
  const TensorView& v = args.input(obj, name, DType::F32, one_d(written));
  check_shape(v, name, {c});
  return v;
}

// An fp32 (C,) output (saved statistics, dgamma, dbeta): given, or allocated.
const TensorView& channel_output(OpArgs& args, py::handle obj, const char* name, int64_t c) {
  const TensorView& v = args.output(obj, name, DType::F32, {c}, one_d());
  check_shape(v, name, {c});
  return v;
}

// An activation input other than x (z, y, dy): x's dtype and shape.
const TensorView& like_x(OpArgs& args, const BnInput& in, py::handle obj, const char* name, bool optional) {
  const TensorView& v = optional ? args.optional_input(obj, name, in.x.dtype, activation_options(in.layout))
                                 : args.input(obj, name, in.x.dtype, activation_options(in.layout));
  if (v.defined()) check_same_shape(v, name, in.x, "x");
  return v;
}

// An activation output: x's dtype and shape, given (writable) or allocated.
const TensorView& output_like_x(OpArgs& args, const BnInput& in, py::handle obj, const char* name) {
  const TensorView& v = args.output(obj, name, in.x.dtype, shape_of(in.x), activation_options(in.layout));
  check_same_shape(v, name, in.x, "x");
  return v;
}

// The arrays both forwards read, as Python passed them.
struct ForwardObjects {
  py::handle x, gamma, beta, running_mean, running_var, z;
};

// x (which fixes the dtype and C), gamma, beta, the running statistics (updated in place when training) and the
// optional residual z, validated in that order into `a` (whose layout is set).
BnInput forward_inputs(OpArgs& args, BatchNormForwardArgs& a, const ForwardObjects& o, py::handle dtype_obj,
                       bool training) {
  const BnInput in = bn_input(args, o.x, a.layout, dtype_obj);
  a.x = in.x;
  a.gamma = channel_param(args, o.gamma, "gamma", in.c);
  a.beta = channel_param(args, o.beta, "beta", in.c);
  a.running_mean = channel_param(args, o.running_mean, "running_mean", in.c, /*written=*/training);
  a.running_var = channel_param(args, o.running_var, "running_var", in.c, /*written=*/training);
  a.z = like_x(args, in, o.z, "z", /*optional=*/true);
  return in;
}

// The flags of a backward that writes dgamma / dbeta (and dz, with a residual).
void check_grad_flags(bool accumulate, py::handle dgamma_obj, py::handle dbeta_obj, bool has_z, py::handle dz_obj) {
  if (accumulate && (dgamma_obj.is_none() || dbeta_obj.is_none())) {
    throw ValueError("accumulate: needs dgamma and dbeta to accumulate into");
  }
  if (!has_z && !dz_obj.is_none()) throw ValueError("dz: given but has_z is False");
}

// dgamma, dbeta and (has_z) dz of a backward, given or allocated in prepare_device(); dz disjoint from `other`
// (dx or x), dy and y.
struct GradOutputs {
  const TensorView* dgamma;
  const TensorView* dbeta;
  const TensorView* dz;
};

GradOutputs grad_outputs(OpArgs& args, const BnInput& in, py::handle dgamma_obj, py::handle dbeta_obj,
                         py::handle dz_obj, bool has_z, NamedView other, const TensorView& dy, const TensorView& y) {
  static const TensorView kNone;
  const GradOutputs g{&channel_output(args, dgamma_obj, "dgamma", in.c),
                      &channel_output(args, dbeta_obj, "dbeta", in.c),
                      has_z ? &output_like_x(args, in, dz_obj, "dz") : &kNone};
  check_disjoint(*g.dz, "dz", {other, {dy, "dy"}, {y, "y"}});
  check_disjoint(*g.dgamma, "dgamma", {{*g.dbeta, "dbeta"}});
  return g;
}

std::string bn_note(Layout layout, bool relu) {
  return std::string("layout=") + layout_name(layout) + (relu ? ", relu" : "");
}

py::tuple batch_norm_train_op(py::handle x_obj, py::handle gamma_obj, py::handle beta_obj, py::handle running_mean_obj,
                              py::handle running_var_obj, py::handle z_obj, py::handle out_obj,
                              py::handle save_mean_obj, py::handle save_invstd_obj, py::handle reserve_obj,
                              py::handle layout_obj, py::handle dtype_obj, py::handle momentum_obj, py::handle eps_obj,
                              bool relu, uintptr_t stream) {
  BatchNormTrainArgs a;
  a.layout = layout_arg(layout_obj);
  a.momentum = number_arg(momentum_obj, "momentum");
  if (!(a.momentum >= 0.0 && a.momentum <= 1.0)) {
    throw ValueError("momentum: expected a value in [0, 1], got " + std::string(py::repr(momentum_obj)));
  }
  a.eps = eps_arg(eps_obj);
  a.relu = relu;
  OpArgs args("batch_norm_train");
  const BnInput in = forward_inputs(args, a, {x_obj, gamma_obj, beta_obj, running_mean_obj, running_var_obj, z_obj},
                                    dtype_obj, /*training=*/true);
  const auto d = nchw_dims(in.x, a.layout);
  if (int64_t(d[0]) * d[2] * d[3] < 2) {
    // One value per channel: the batch variance is 0 and the unbiased running variance 0/0 (PyTorch refuses too).
    throw ValueError("x: expected more than 1 value per channel when training, got N*H*W = 1 (shape " +
                     in.x.shape_str() + ")");
  }
  // The outputs are references into `args`: a missing one gets its memory in prepare_device().
  const TensorView& y = output_like_x(args, in, out_obj, "out");
  const TensorView& save_mean = channel_output(args, save_mean_obj, "save_mean", in.c);
  const TensorView& save_invstd = channel_output(args, save_invstd_obj, "save_invstd", in.c);
  // The reserve space: opaque bytes (fp32 for tensor_arg), reused when given, else sized after the device check.
  const TensorView* reserve = &args.optional_output(reserve_obj, "reserve", DType::F32, one_d());
  check_disjoint(y, "out", {{in.x, "x"}, {a.z, "z"}});
  check_disjoint(save_mean, "save_mean", {{save_invstd, "save_invstd"}});
  check_disjoint(a.running_mean, "running_mean", {{a.running_var, "running_var"}});
  args.set_note(bn_note(a.layout, relu));
  args.prepare_device();
  if (reserve_obj.is_none()) {
    // 0: the unfused path. Never 0 on the fused path: the buffer is also backward's token of it.
    const size_t nbytes = batch_norm_reserve_size(a.layout, in.x.dtype, nchw_dims(in.x, a.layout), relu, a.z.defined(),
                                                  stream_arg(stream));
    if (nbytes) reserve = &args.allocate("reserve", DType::F32, {static_cast<int64_t>((nbytes + 3) / 4)});
  }
  a.y = y;
  a.save_mean = save_mean;
  a.save_invstd = save_invstd;
  a.reserve = *reserve;
  OpContext context(&OpArgs::describe, &args);
  batch_norm_forward_training(a, stream_arg(stream));
  return py::make_tuple(args.object(y), args.object(save_mean), args.object(save_invstd), args.object(*reserve));
}

py::object batch_norm_infer_op(py::handle x_obj, py::handle gamma_obj, py::handle beta_obj, py::handle running_mean_obj,
                               py::handle running_var_obj, py::handle z_obj, py::handle out_obj, py::handle layout_obj,
                               py::handle dtype_obj, py::handle eps_obj, bool relu, uintptr_t stream) {
  BatchNormInferArgs a;
  a.layout = layout_arg(layout_obj);
  a.eps = eps_arg(eps_obj);
  a.relu = relu;
  OpArgs args("batch_norm_infer");
  const BnInput in = forward_inputs(args, a, {x_obj, gamma_obj, beta_obj, running_mean_obj, running_var_obj, z_obj},
                                    dtype_obj, /*training=*/false);
  const TensorView& y = output_like_x(args, in, out_obj, "out");
  check_disjoint(y, "out", {{in.x, "x"}, {a.z, "z"}});
  args.set_note(bn_note(a.layout, relu));
  args.prepare_device();
  a.y = y;
  OpContext context(&OpArgs::describe, &args);
  batch_norm_forward_inference(a, stream_arg(stream));
  return args.object(y);
}

py::tuple batch_norm_backward_op(py::handle x_obj, py::handle dy_obj, py::handle y_obj, py::handle gamma_obj,
                                 py::handle beta_obj, py::handle save_mean_obj, py::handle save_invstd_obj,
                                 py::handle reserve_obj, py::handle dx_obj, py::handle dgamma_obj, py::handle dbeta_obj,
                                 py::handle dz_obj, py::handle layout_obj, py::handle dtype_obj, py::handle eps_obj,
                                 bool relu, bool has_z, bool accumulate, uintptr_t stream) {
  BatchNormBackwardArgs a;
  a.layout = layout_arg(layout_obj);
  a.eps = eps_arg(eps_obj);
  a.relu = relu;
  a.has_z = has_z;
  a.accumulate = accumulate;
  check_grad_flags(accumulate, dgamma_obj, dbeta_obj, has_z, dz_obj);
  if (relu && y_obj.is_none()) throw ValueError("y: the forward output is required with relu=True (the ReLU mask)");
  OpArgs args("batch_norm_backward");
  const BnInput in = bn_input(args, x_obj, a.layout, dtype_obj);
  a.x = in.x;
  a.dy = like_x(args, in, dy_obj, "dy", /*optional=*/false);
  a.y = like_x(args, in, y_obj, "y", /*optional=*/true);
  a.gamma = channel_param(args, gamma_obj, "gamma", in.c);
  a.beta = channel_param(args, beta_obj, "beta", in.c);
  a.save_mean = channel_param(args, save_mean_obj, "save_mean", in.c);
  a.save_invstd = channel_param(args, save_invstd_obj, "save_invstd", in.c);
  a.reserve = args.optional_input(reserve_obj, "reserve", DType::F32, one_d());
  const TensorView& dx = output_like_x(args, in, dx_obj, "dx");
  const GradOutputs g = grad_outputs(args, in, dgamma_obj, dbeta_obj, dz_obj, has_z, {dx, "dx"}, a.dy, a.y);
  check_disjoint(dx, "dx", {{in.x, "x"}, {a.dy, "dy"}, {a.y, "y"}});
  args.set_note(bn_note(a.layout, relu) + (has_z ? ", has_z" : ""));
  args.prepare_device();
  a.dx = dx;
  a.dgamma = *g.dgamma;
  a.dbeta = *g.dbeta;
  a.dz = *g.dz;
  OpContext context(&OpArgs::describe, &args);
  batch_norm_backward(a, stream_arg(stream));
  return py::make_tuple(args.object(dx), args.object(*g.dgamma), args.object(*g.dbeta), args.object(*g.dz));
}

// ---- synchronized batch norm: the kernels of norm/sync_batch_norm.h, the all-reduce of `sums` left to Python -----

// The (2, C) fp32 per-channel sums: this rank's (written; given, or allocated) or all ranks' (read).
const TensorView& sums_arg(OpArgs& args, py::handle obj, int64_t c, bool written) {
  TensorArgOptions options;
  options.ndim = 2;
  options.writable = written;
  const TensorView& v =
      written ? args.output(obj, "sums", DType::F32, {2, c}, options) : args.input(obj, "sums", DType::F32, options);
  check_shape(v, "sums", {2, c});
  return v;
}

// Elements per channel over all ranks: at least this rank's N * H * W.
double count_arg(py::handle obj, const BnInput& in) {
  const double count = number_arg(obj, "count");
  const auto d = nchw_dims(in.x, in.layout);
  const double local = double(d[0]) * d[2] * d[3];
  if (!(count >= local && count >= 1.0 && count < 9.0e15)) {
    throw ValueError("count: expected the elements per channel over all ranks, at least this rank's " +
                     std::to_string(int64_t(local)) + ", got " + std::string(py::repr(obj)));
  }
  return count;
}

py::object sync_bn_sums_op(py::handle x_obj, py::handle shift_obj, py::handle sums_obj, py::handle layout_obj,
                           py::handle dtype_obj, uintptr_t stream) {
  OpArgs args("sync_batch_norm_sums");
  const BnInput in = bn_input(args, x_obj, layout_arg(layout_obj), dtype_obj);
  const TensorView& shift = channel_param(args, shift_obj, "shift", in.c);
  const TensorView& sums = sums_arg(args, sums_obj, in.c, /*written=*/true);
  args.set_note(bn_note(in.layout, false));
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  sync_bn_sums(in.x, shift, sums, in.layout, stream_arg(stream));
  return args.object(sums);
}

py::tuple sync_bn_forward_op(py::handle x_obj, py::handle z_obj, py::handle sums_obj, py::handle gamma_obj,
                             py::handle beta_obj, py::handle running_mean_obj, py::handle running_var_obj,
                             py::handle out_obj, py::handle save_mean_obj, py::handle save_invstd_obj,
                             py::handle count_obj, py::handle layout_obj, py::handle dtype_obj, py::handle momentum_obj,
                             py::handle eps_obj, bool relu, uintptr_t stream) {
  SyncBnForwardArgs a;
  a.layout = layout_arg(layout_obj);
  a.momentum = float(number_arg(momentum_obj, "momentum"));
  if (!(a.momentum >= 0.0f && a.momentum <= 1.0f)) {
    throw ValueError("momentum: expected a value in [0, 1], got " + std::string(py::repr(momentum_obj)));
  }
  a.eps = float(eps_arg(eps_obj));
  a.relu = relu;
  OpArgs args("sync_batch_norm_forward");
  const BnInput in = bn_input(args, x_obj, a.layout, dtype_obj);
  a.x = in.x;
  a.z = like_x(args, in, z_obj, "z", /*optional=*/true);
  a.sums = sums_arg(args, sums_obj, in.c, /*written=*/false);
  a.gamma = channel_param(args, gamma_obj, "gamma", in.c);
  a.beta = channel_param(args, beta_obj, "beta", in.c);
  a.running_mean = channel_param(args, running_mean_obj, "running_mean", in.c, /*written=*/true);
  a.running_var = channel_param(args, running_var_obj, "running_var", in.c, /*written=*/true);
  a.count = count_arg(count_obj, in);
  const TensorView& y = output_like_x(args, in, out_obj, "out");
  const TensorView& save_mean = channel_output(args, save_mean_obj, "save_mean", in.c);
  const TensorView& save_invstd = channel_output(args, save_invstd_obj, "save_invstd", in.c);
  check_disjoint(y, "out", {{in.x, "x"}, {a.z, "z"}});
  check_disjoint(save_mean, "save_mean", {{save_invstd, "save_invstd"}});
  check_disjoint(a.running_mean, "running_mean", {{a.running_var, "running_var"}});
  args.set_note(bn_note(a.layout, relu));
  args.prepare_device();
  a.y = y;
  a.save_mean = save_mean;
  a.save_invstd = save_invstd;
  OpContext context(&OpArgs::describe, &args);
  sync_bn_forward(a, stream_arg(stream));
  return py::make_tuple(args.object(y), args.object(save_mean), args.object(save_invstd));
}

// What both backward halves parse: x, dy, y (the ReLU mask) and the saved statistics.
BnInput sync_backward_inputs(OpArgs& args, SyncBnBackwardArgs& a, py::handle x_obj, py::handle dy_obj, py::handle y_obj,
                             py::handle save_mean_obj, py::handle save_invstd_obj, py::handle dtype_obj) {
  if (a.relu && y_obj.is_none()) throw ValueError("y: the forward output is required with relu=True (the ReLU mask)");
  const BnInput in = bn_input(args, x_obj, a.layout, dtype_obj);
  a.x = in.x;
  a.dy = like_x(args, in, dy_obj, "dy", /*optional=*/false);
  a.y = like_x(args, in, y_obj, "y", /*optional=*/true);
  a.save_mean = channel_param(args, save_mean_obj, "save_mean", in.c);
  a.save_invstd = channel_param(args, save_invstd_obj, "save_invstd", in.c);
  return in;
}

py::tuple sync_bn_grad_sums_op(py::handle x_obj, py::handle dy_obj, py::handle y_obj, py::handle save_mean_obj,
                               py::handle save_invstd_obj, py::handle sums_obj, py::handle dgamma_obj,
                               py::handle dbeta_obj, py::handle dz_obj, py::handle layout_obj, py::handle dtype_obj,
                               bool relu, bool has_z, bool accumulate, uintptr_t stream) {
  SyncBnBackwardArgs a;
  a.layout = layout_arg(layout_obj);
  a.relu = relu;
  a.accumulate = accumulate;
  check_grad_flags(accumulate, dgamma_obj, dbeta_obj, has_z, dz_obj);
  OpArgs args("sync_batch_norm_grad_sums");
  const BnInput in = sync_backward_inputs(args, a, x_obj, dy_obj, y_obj, save_mean_obj, save_invstd_obj, dtype_obj);
  // The outputs are references into `args`: a missing one gets its memory in prepare_device().
  const TensorView& sums = sums_arg(args, sums_obj, in.c, /*written=*/true);
  const GradOutputs g = grad_outputs(args, in, dgamma_obj, dbeta_obj, dz_obj, has_z, {in.x, "x"}, a.dy, a.y);
  args.set_note(bn_note(a.layout, relu) + (has_z ? ", has_z" : ""));
  args.prepare_device();
  a.sums = sums;
  a.dgamma = *g.dgamma;
  a.dbeta = *g.dbeta;
  a.dz = *g.dz;
  OpContext context(&OpArgs::describe, &args);
  sync_bn_grad_sums(a, stream_arg(stream));
  return py::make_tuple(args.object(sums), args.object(*g.dgamma), args.object(*g.dbeta), args.object(*g.dz));
}

py::object sync_bn_backward_op(py::handle x_obj, py::handle dy_obj, py::handle y_obj, py::handle gamma_obj,
                               py::handle save_mean_obj, py::handle save_invstd_obj, py::handle sums_obj,
                               py::handle dx_obj, py::handle count_obj, py::handle layout_obj, py::handle dtype_obj,
                               bool relu, uintptr_t stream) {
  SyncBnBackwardArgs a;
  a.layout = layout_arg(layout_obj);
  a.relu = relu;
  OpArgs args("sync_batch_norm_backward");
  const BnInput in = sync_backward_inputs(args, a, x_obj, dy_obj, y_obj, save_mean_obj, save_invstd_obj, dtype_obj);
  a.sums = sums_arg(args, sums_obj, in.c, /*written=*/false);
  a.gamma = channel_param(args, gamma_obj, "gamma", in.c);
  a.count = count_arg(count_obj, in);
  const TensorView& dx = output_like_x(args, in, dx_obj, "dx");
  check_disjoint(dx, "dx", {{in.x, "x"}, {a.dy, "dy"}, {a.y, "y"}});
  args.set_note(bn_note(a.layout, relu));
  args.prepare_device();
  a.dx = dx;
  OpContext context(&OpArgs::describe, &args);
  sync_bn_backward(a, stream_arg(stream));
  return args.object(dx);
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

size_t reserve_size_op(py::handle x_shape_obj, py::handle layout_obj, py::handle dtype_obj, bool relu, bool has_z,
                       uintptr_t stream) {
  const Layout layout = layout_arg(layout_obj);
  const DType dtype = exact_dtype_arg(dtype_obj);
  const std::vector<int64_t> s = shape_arg(x_shape_obj, "x_shape", 4, activation_dims(layout), /*int32_dims=*/true);
  return batch_norm_reserve_size(layout, dtype, shape_nchw(s, layout), relu, has_z, stream_arg(stream));
}

}  // namespace

void bind_norm(py::module_& m) {
  m.def("batch_norm_train", &batch_norm_train_op, py::arg("x"), py::arg("gamma"), py::arg("beta"),
        py::arg("running_mean"), py::arg("running_var"), py::arg("z"), py::arg("out"), py::arg("save_mean"),
        py::arg("save_invstd"), py::arg("reserve"), py::arg("layout"), py::arg("dtype"), py::arg("momentum"),
        py::arg("eps"), py::arg("relu"), py::arg("stream"), "Returns (out, save_mean, save_invstd, reserve or None).");
  m.def("batch_norm_infer", &batch_norm_infer_op, py::arg("x"), py::arg("gamma"), py::arg("beta"),
        py::arg("running_mean"), py::arg("running_var"), py::arg("z"), py::arg("out"), py::arg("layout"),
        py::arg("dtype"), py::arg("eps"), py::arg("relu"), py::arg("stream"), "Returns out.");
  m.def("batch_norm_backward", &batch_norm_backward_op, py::arg("x"), py::arg("dy"), py::arg("y"), py::arg("gamma"),
        py::arg("beta"), py::arg("save_mean"), py::arg("save_invstd"), py::arg("reserve"), py::arg("dx"),
        py::arg("dgamma"), py::arg("dbeta"), py::arg("dz"), py::arg("layout"), py::arg("dtype"), py::arg("eps"),
        py::arg("relu"), py::arg("has_z"), py::arg("accumulate"), py::arg("stream"),
        "Returns (dx, dgamma, dbeta, dz or None).");
  m.def("batch_norm_reserve_size", &reserve_size_op, py::arg("x_shape"), py::arg("layout"), py::arg("dtype"),
        py::arg("relu"), py::arg("has_z"), py::arg("stream"),
        "Bytes of reserve space batch_norm_train needs (0: none).");
  m.def("sync_batch_norm_sums", &sync_bn_sums_op, py::arg("x"), py::arg("shift"), py::arg("sums"), py::arg("layout"),
        py::arg("dtype"), py::arg("stream"), "This rank's (2, C) sums about shift, written into sums.");
  m.def("sync_batch_norm_forward", &sync_bn_forward_op, py::arg("x"), py::arg("z"), py::arg("sums"), py::arg("gamma"),
        py::arg("beta"), py::arg("running_mean"), py::arg("running_var"), py::arg("out"), py::arg("save_mean"),
        py::arg("save_invstd"), py::arg("count"), py::arg("layout"), py::arg("dtype"), py::arg("momentum"),
        py::arg("eps"), py::arg("relu"), py::arg("stream"), "Returns (out, save_mean, save_invstd).");
  m.def("sync_batch_norm_grad_sums", &sync_bn_grad_sums_op, py::arg("x"), py::arg("dy"), py::arg("y"),
        py::arg("save_mean"), py::arg("save_invstd"), py::arg("sums"), py::arg("dgamma"), py::arg("dbeta"),
        py::arg("dz"), py::arg("layout"), py::arg("dtype"), py::arg("relu"), py::arg("has_z"), py::arg("accumulate"),
        py::arg("stream"), "Returns (sums, dgamma, dbeta, dz or None).");
  m.def("sync_batch_norm_backward", &sync_bn_backward_op, py::arg("x"), py::arg("dy"), py::arg("y"), py::arg("gamma"),
        py::arg("save_mean"), py::arg("save_invstd"), py::arg("sums"), py::arg("dx"), py::arg("count"),
        py::arg("layout"), py::arg("dtype"), py::arg("relu"), py::arg("stream"), "Returns dx.");
  m.def("batch_norm_last_path", [] {
    const BatchNormPath p = batch_norm_last_path();
    py::dict d;
    d["op"] = p.op;
    d["fused"] = p.fused;
    d["ex"] = p.ex;
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
}

}  // namespace rn
