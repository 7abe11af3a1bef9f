// Python bindings of the convolution engine (resnet_native/conv.py wraps them).
//
// Every op validates all of its arguments (types, dtypes, ranks, shapes, geometry, aliasing) before it touches
// the device, through OpArgs (op_args.h) as every binding does: arrays parsed without the device check, then the
// relations between them, then the device check and the allocation of a missing output, then the op.
// Each array is parsed once per call (the device check runs on the parsed views): these ops are called per
// layer and direction, and with small problems their host time is the step time.
// A spec arrives as a _C.ConvSpec that conv.py built once per direction (its ranges checked then), and
// directions, layouts and dtypes as the typed enums of bind_enums.cpp: no call parses a string.
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "../conv/algo_cache.h"
#include "../conv/conv_dispatch.h"
#include "../conv/conv_geometry.h"
#include "../conv/conv_params.h"
#include "../conv/conv_spec.h"
#include "../conv/legacy_algo_names.h"
#include "../conv/legacy_engine.h"
#include "../core/device.h"
#include "../core/error.h"
#include "../core/workspace.h"
#include "../kernels/channel_sums.h"
#include "bindings.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

Dims4 view_dims(const TensorView& v) {
  return {v.shape[0], v.shape[1], v.shape[2], v.shape[3]};
}

std::vector<int64_t> as_vector(const Dims4& d) {
  return {d[0], d[1], d[2], d[3]};
}

// The per-call fields of the key: the device and the workspace cap in force (both need a GPU).
void bind_to_current_device(ConvParams& p) {
  p.device = current_device();
  const size_t limit = WorkspacePool::current().limit();
  p.workspace_cap = limit == SIZE_MAX ? UINT64_MAX : static_cast<uint64_t>(limit);
}

// What the three convolution ops share once every argument is validated: the device checked and a missing output
// allocated (args.prepare_device), the output bound to its operand slot (`ops.*slot`), the convolution run.
py::object convolve(ConvParams params, ConvOperands ops, TensorView ConvOperands::* slot, OpArgs& args,
                    const TensorView& out, bool allow_fusion, uintptr_t stream) {
  args.prepare_device();
  ops.*slot = out;
  bind_to_current_device(params);
  convolution(params, ops, allow_fusion, stream_arg(stream));
  return args.object(out);
}

uint8_t epilogue_flags(bool bias, bool z, const std::string& activation) {
  if (activation != "identity" && activation != "relu") {
    throw ValueError("activation: expected 'identity' or 'relu', got '" + activation + "'");
  }
  return static_cast<uint8_t>((bias ? kEpilogueBias : 0) | (z ? kEpilogueResidual : 0) |
                              (activation == "relu" ? kEpilogueRelu : 0));
}

// A forward convolution's operands, once bias (one per output channel) and z (y's shape) fit the key.
ConvOperands forward_operands(const ConvParams& params, const std::vector<int64_t>& y_shape, const TensorView& x,
                              const TensorView& w, const TensorView& bias, const TensorView& z) {
  if (bias.defined()) check_shape(bias, "bias", {params.y[1]}, "one per output channel");
  if (z.defined()) check_shape(z, "z", y_shape, "the output's shape");
  ConvOperands ops;
  ops.x = x;
  ops.w = w;
  ops.bias = bias;
  ops.z = z;
  return ops;
}

// The float ops' storage dtype; int8 / fp8 specs belong to conv_forward_quantized.
DType float_storage(const ConvSpec& spec) {
  if (is_quantized(spec.precision)) {
    throw ValueError(std::string("spec: precision '") + precision_name(spec.precision) +
                     "' is for quantised forward convolutions (conv.quantized_conv2d)");
  }
  return storage_dtype(spec.precision);
}

py::object conv_forward(py::handle x_obj, py::handle w_obj, py::handle out_obj, py::handle bias_obj, py::handle z_obj,
                        const ConvSpec& spec, const std::string& activation, float alpha1, float alpha2,
                        bool allow_fusion, uintptr_t stream) {
  const DType dtype = float_storage(spec);
  OpArgs args("conv2d");
  const TensorView& x = args.input(x_obj, "x", dtype, rank(4));
  const TensorView& w = args.input(w_obj, "w", dtype, rank(4));
  const TensorView& bias = args.optional_input(bias_obj, "bias", dtype, rank(1));
  const TensorView& z = args.optional_input(z_obj, "z", dtype, rank(4));
  const uint8_t epilogue = epilogue_flags(bias.defined(), z.defined(), activation);
  const ConvParams params =
      make_conv_params(ConvDirection::Forward, spec, view_dims(x), view_dims(w), epilogue, "x", "w");
  const std::vector<int64_t> y_shape = as_vector(output_shape(params));
  ConvOperands ops = forward_operands(params, y_shape, x, w, bias, z);
  const TensorView& out = args.output(out_obj, "out", dtype, y_shape, rank(4));
  check_shape(out, "out", y_shape, "the convolution's output");
  check_disjoint(out, "out", {{x, "x"}, {w, "w"}, {z, "z"}, {bias, "bias"}});
  ops.alpha1 = alpha1;
  ops.alpha2 = alpha2;
  return convolve(params, ops, &ConvOperands::y, args, out, allow_fusion, stream);
}

// The dtypes a quantised convolution may write y in, as the codes Python passes (ConvParams::out_dtype's).
py::dict quantized_out_codes() {
  py::dict d;
  for (DType t : kQuantizedOutDtypes) d[dtype_short_name(t)] = out_dtype_code(t);
  return d;
}

// y = [relu](scale[k] * conv(x, w) + bias[k] [+ gamma * z]) with x, w (and z) int8 or FP8 E4M3 (uint8 codes), NHWC,
// on the graph engine: the quantised forward of an inference engine, the conversion to y's dtype (rounding to
// nearest, saturating) done by cuDNN's epilogue. out_code: quantized_out_codes()[name of y's dtype].
py::object conv_forward_quantized(py::handle x_obj, py::handle w_obj, py::handle scale_obj, py::handle bias_obj,
                                  py::handle z_obj, py::handle out_obj, const ConvSpec& spec, bool relu, float gamma,
                                  int out_code, uintptr_t stream) {
  if (!is_quantized(spec.precision)) {
    throw ValueError(std::string("spec: expected precision 'int8' or 'fp8', got '") + precision_name(spec.precision) +
                     "'");
  }
  if (spec.engine != ConvEngineKind::Graph) throw ValueError("spec: int8 / fp8 convolutions need engine='graph'");
  if (spec.layout != Layout::NHWC) throw ValueError("spec: int8 / fp8 convolutions need layout='NHWC'");
  const DType dtype = storage_dtype(spec.precision);
  const DType y_dtype = static_cast<DType>(out_code - 1);
  const bool known = std::any_of(std::begin(kQuantizedOutDtypes), std::end(kQuantizedOutDtypes),
                                 [&](DType t) { return out_code == out_dtype_code(t); });
  const bool valid_out = known && (y_dtype == dtype || y_dtype == DType::F16 || y_dtype == DType::F32);
  if (!valid_out) {
    throw ValueError(std::string("out_dtype: expected '") + dtype_short_name(dtype) + "', 'fp16' or 'fp32' for " +
                     precision_name(spec.precision) + " (code " + std::to_string(out_code) + ")");
  }
  if (!std::isfinite(gamma)) throw ValueError("gamma: expected a finite number");
  OpArgs args("conv2d_quantized");
  const TensorView& x = args.input(x_obj, "x", dtype, rank(4));
  const TensorView& w = args.input(w_obj, "w", dtype, rank(4));
  const TensorView& scale = args.input(scale_obj, "scale", DType::F32, rank(1));
  const TensorView& bias = args.optional_input(bias_obj, "bias", DType::F32, rank(1));
  const TensorView& z = args.optional_input(z_obj, "z", dtype, rank(4));
  const uint8_t epilogue =
      static_cast<uint8_t>(kEpilogueScale | epilogue_flags(bias.defined(), z.defined(), relu ? "relu" : "identity"));
  ConvParams params = make_conv_params(ConvDirection::Forward, spec, view_dims(x), view_dims(w), epilogue, "x", "w");
  params.out_dtype = y_dtype == dtype ? 0 : out_dtype_code(y_dtype);
  const std::vector<int64_t> y_shape = as_vector(output_shape(params));
  check_shape(scale, "scale", {params.y[1]}, "one per output channel");
  ConvOperands ops = forward_operands(params, y_shape, x, w, bias, z);
  const TensorView& out = args.output(out_obj, "out", y_dtype, y_shape, rank(4));
  check_shape(out, "out", y_shape, "the convolution's output");
  check_disjoint(out, "out", {{x, "x"}, {w, "w"}, {z, "z"}, {bias, "bias"}, {scale, "scale"}});
  ops.scale = scale;
  ops.alpha2 = gamma;
  return convolve(params, ops, &ConvOperands::y, args, out, true, stream);
}

py::object conv_backward_data(py::handle dy_obj, py::handle w_obj, py::handle out_obj, py::handle x_shape_obj,
                              bool accumulate, const ConvSpec& spec, uintptr_t stream) {
  const DType dtype = float_storage(spec);
  const Dims4 x_shape = int64s_arg<4>(x_shape_obj, "x_shape");
  if (accumulate && out_obj.is_none()) {
    throw ValueError("accumulate: accumulating into the input gradient needs out= (the gradient to add to)");
  }
  OpArgs args("conv2d_backward_data");
  const TensorView& dy = args.input(dy_obj, "dy", dtype, rank(4));
  const TensorView& w = args.input(w_obj, "w", dtype, rank(4));
  const ConvParams params =
      make_conv_params(ConvDirection::BackwardData, spec, x_shape, view_dims(w), kEpilogueNone, "x_shape", "w");
  check_shape(dy, "dy", as_vector(output_shape(params)), "the convolution's output");
  const TensorView& out = args.output(out_obj, "out", dtype, as_vector(x_shape), rank(4));
  check_shape(out, "out", as_vector(x_shape), "x_shape");
  check_disjoint(out, "out", {{dy, "dy"}, {w, "w"}});
  ConvOperands ops;
  ops.w = w;
  ops.y = dy;
  ops.beta = accumulate ? 1.0f : 0.0f;
  return convolve(params, ops, &ConvOperands::x, args, out, true, stream);
}

py::object conv_backward_filter(py::handle x_obj, py::handle dy_obj, py::handle out_obj, py::handle w_shape_obj,
                                bool accumulate, const ConvSpec& spec, uintptr_t stream) {
  const DType dtype = float_storage(spec);
  const Dims4 w_shape = int64s_arg<4>(w_shape_obj, "w_shape");
  if (accumulate && out_obj.is_none()) {
    throw ValueError("accumulate: accumulating into the gradient needs out= (the existing dw)");
  }
  OpArgs args("conv2d_backward_filter");
  const TensorView& x = args.input(x_obj, "x", dtype, rank(4));
  const TensorView& dy = args.input(dy_obj, "dy", dtype, rank(4));
  const ConvParams params =
      make_conv_params(ConvDirection::BackwardFilter, spec, view_dims(x), w_shape, kEpilogueNone, "x", "w_shape");
  check_shape(dy, "dy", as_vector(output_shape(params)), "the convolution's output");
  const TensorView& out = args.output(out_obj, "out", dtype, as_vector(w_shape), rank(4));
  check_shape(out, "out", as_vector(w_shape), "w_shape");
  check_disjoint(out, "out", {{x, "x"}, {dy, "dy"}});
  ConvOperands ops;
  ops.x = x;
  ops.y = dy;
  ops.beta = accumulate ? 1.0f : 0.0f;
  return convolve(params, ops, &ConvOperands::w, args, out, true, stream);
}

py::object conv_backward_bias(py::handle dy_obj, py::handle out_obj, Layout layout, DType dtype, uintptr_t stream) {
  OpArgs args("conv2d_backward_bias");
  const TensorView& dy = args.input(dy_obj, "dy", dtype, rank(4));
  check_int32_shape(view_dims(dy), "dy");
  const int64_t k = logical_dims(view_dims(dy), layout)[1];
  const TensorView& out = args.output(out_obj, "out", dtype, {k}, rank(1));
  check_shape(out, "out", {k}, "one per channel of dy");
  check_disjoint(out, "out", {{dy, "dy"}});
  args.set_note(std::string("layout=") + layout_name(layout));
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::channel_sums(dy, out, layout, stream_arg(stream));
  return args.object(out);
}

py::tuple output_shape_of(py::handle x_shape_obj, py::handle w_shape_obj, const ConvSpec& spec) {
  const Dims4 y =
      output_shape(make_conv_params(ConvDirection::Forward, spec, int64s_arg<4>(x_shape_obj, "x_shape"),
                                    int64s_arg<4>(w_shape_obj, "w_shape"), kEpilogueNone, "x_shape", "w_shape"));
  return py::make_tuple(y[0], y[1], y[2], y[3]);
}

// The key an op would use (last_algorithm): device and workspace cap as they are now.
std::string conv_key(ConvDirection direction, py::handle x_shape_obj, py::handle w_shape_obj, const ConvSpec& spec,
                     const std::string& epilogue) {
  const uint8_t flags = parse_epilogue(epilogue);
  if (flags != kEpilogueNone && direction != ConvDirection::Forward) {
    throw ValueError("fused: only forward convolutions have an epilogue");
  }
  ConvParams params = make_conv_params(direction, spec, int64s_arg<4>(x_shape_obj, "x_shape"),
                                       int64s_arg<4>(w_shape_obj, "w_shape"), flags, "x_shape", "w_shape");
  if (device_count() > 0) {
    bind_to_current_device(params);
  } else {
    params.workspace_cap = workspace_limit() == SIZE_MAX ? UINT64_MAX : workspace_limit();
  }
  return params.to_string();
}

py::tuple pair_tuple(const std::array<int32_t, 2>& v) {
  return py::make_tuple(v[0], v[1]);
}

std::string spec_repr(const ConvSpec& s) {
  auto pair = [](const std::array<int32_t, 2>& v) {
    return "(" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ")";
  };
  return "ConvSpec(stride=" + pair(s.stride) + ", padding=" + pair(s.padding) + ", dilation=" + pair(s.dilation) +
         ", groups=" + std::to_string(s.groups) + ", layout=" + layout_name(s.layout) +
         ", precision=" + precision_name(s.precision) + ", engine=" + engine_name(s.engine) +
         ", algo_mode=" + algo_mode_name(s.algo_mode) + ", fixed_algo=" + std::to_string(s.fixed_algo) +
         ", deterministic=" + (s.deterministic ? "True" : "False") + ")";
}

void bind_conv_spec(py::module_& m) {
  py::class_<ConvSpec>(m, "ConvSpec",
                       "One direction's convolution spec as the ops take it (resnet_native.conv.ConvSpec builds "
                       "them); the constructor checks every range.")
      .def(py::init([](py::handle stride, py::handle padding, py::handle dilation, py::handle groups, Layout layout,
                       Precision precision, ConvEngineKind engine, AlgoMode algo_mode, py::handle fixed_algo,
                       bool deterministic) {
             return ConvSpec::make(int64s_arg<2>(stride, "stride"), int64s_arg<2>(padding, "padding"),
                                   int64s_arg<2>(dilation, "dilation"), int64_arg(groups, "groups"), layout, precision,
                                   engine, algo_mode, int64_arg(fixed_algo, "algo"), deterministic);
           }),
           py::kw_only(), py::arg("stride") = py::make_tuple(1, 1), py::arg("padding") = py::make_tuple(0, 0),
           py::arg("dilation") = py::make_tuple(1, 1), py::arg("groups") = 1, py::arg("layout") = Layout::NCHW,
           py::arg("precision") = Precision::FP32, py::arg("engine") = ConvEngineKind::Auto,
           py::arg("algo_mode") = AlgoMode::Find, py::arg("fixed_algo") = 0, py::arg("deterministic") = false)
      .def_property_readonly("stride", [](const ConvSpec& s) { return pair_tuple(s.stride); })
      .def_property_readonly("padding", [](const ConvSpec& s) { return pair_tuple(s.padding); })
      .def_property_readonly("dilation", [](const ConvSpec& s) { return pair_tuple(s.dilation); })
      .def_readonly("groups", &ConvSpec::groups)
      .def_readonly("layout", &ConvSpec::layout)
      .def_readonly("precision", &ConvSpec::precision)
      .def_readonly("engine", &ConvSpec::engine)
      .def_readonly("algo_mode", &ConvSpec::algo_mode)
      .def_readonly("fixed_algo", &ConvSpec::fixed_algo)
      .def_readonly("deterministic", &ConvSpec::deterministic)
      .def(py::self == py::self)
      .def(py::self != py::self)
      .def("__repr__", &spec_repr);
}

}  // namespace

void bind_conv(py::module_& m) {
  bind_conv_spec(m);
  m.def("conv_forward", &conv_forward, py::arg("x"), py::arg("w"), py::arg("out"), py::arg("bias"), py::arg("z"),
        py::arg("spec"), py::arg("activation"), py::arg("alpha1"), py::arg("alpha2"), py::arg("allow_fusion"),
        py::arg("stream"), "y = act(alpha1 * conv(x, w) + alpha2 * z + bias); returns out (allocated when None).");
  m.def("conv_forward_quantized", &conv_forward_quantized, py::arg("x"), py::arg("w"), py::arg("scale"),
        py::arg("bias"), py::arg("z"), py::arg("out"), py::arg("spec"), py::arg("relu"), py::arg("gamma"),
        py::arg("out_code"), py::arg("stream"),
        "y = [relu](scale * conv(x, w) + bias [+ gamma * z]) in int8 / fp8 (graph engine, NHWC); returns out.");
  m.def("quantized_out_codes", &quantized_out_codes, "{dtype name: code} of the dtypes a quantised conv writes.");
  m.def("conv_backward_data", &conv_backward_data, py::arg("dy"), py::arg("w"), py::arg("out"), py::arg("x_shape"),
        py::arg("accumulate"), py::arg("spec"), py::arg("stream"),
        "dx of a convolution (added to out when accumulate); returns out (allocated when None).");
  m.def("conv_backward_filter", &conv_backward_filter, py::arg("x"), py::arg("dy"), py::arg("out"), py::arg("w_shape"),
        py::arg("accumulate"), py::arg("spec"), py::arg("stream"),
        "dw of a convolution (added to out when accumulate); returns out (allocated when None).");
  m.def("conv_backward_bias", &conv_backward_bias, py::arg("dy"), py::arg("out"), py::arg("layout"), py::arg("dtype"),
        py::arg("stream"), "db = sum of dy over N, H, W; returns out (allocated when None).");
  m.def("conv_output_shape", &output_shape_of, py::arg("x_shape"), py::arg("w_shape"), py::arg("spec"),
        "Output shape in the spec's layout, after the ops' own validation (no GPU needed).");
  m.def("conv_key", &conv_key, py::arg("direction"), py::arg("x_shape"), py::arg("w_shape"), py::arg("spec"),
        py::arg("epilogue"), "The algorithm-cache key an op with these arguments uses now.");
  m.def("conv_algo_names", &legacy::algo_names, py::arg("direction"),
        "The legacy engine's algorithm names of a direction, indexed by cuDNN's enum value.");
  m.def("conv_algo_is_deterministic", &legacy::algo_is_deterministic, py::arg("direction"), py::arg("algo"));
}

}  // namespace rn
