// Python bindings of the convolution engine (resnet_native/conv.py wraps them).
//
// Every op validates all of its arguments (types, dtypes, ranks, shapes, geometry, aliasing) before it touches
// the device: arrays are first parsed without the device check, the output is allocated with cupy only when
// the inputs are valid, and only then are pointers checked against the current device and the op run.
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
#include "../conv/legacy_int8_probe.h"
#include "../core/device.h"
#include "../core/error.h"
#include "../core/workspace.h"
#include "bindings.h"
#include "output_alloc.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace rn {
namespace {

// A Python int as int64 (TypeError for anything else, bool included; ValueError beyond int64).
int64_t int_arg(py::handle obj, const char* name) {
  if (!PyLong_Check(obj.ptr()) || PyBool_Check(obj.ptr())) {
    throw TypeError(std::string(name) + ": expected an int, got " +
                    std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
  if (overflow != 0) throw ValueError(std::string(name) + ": " + std::string(py::repr(obj)) + " is out of range");
  return value;
}

// A sequence of `n` ints (ValueError naming `name` otherwise).
template <size_t N>
std::array<int64_t, N> ints_arg(py::handle obj, const char* name) {
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj) || py::len(obj) != N) {
    throw ValueError(std::string(name) + ": expected a tuple of " + std::to_string(N) + " ints, got " +
                     std::string(py::repr(obj)));
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  std::array<int64_t, N> values{};
  for (size_t i = 0; i < N; ++i) values[i] = int_arg(seq[i], name);
  return values;
}

Dims4 view_dims(const TensorView& v) {
  return {v.shape[0], v.shape[1], v.shape[2], v.shape[3]};
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::vector<int64_t> as_vector(const Dims4& d) {
  return {d[0], d[1], d[2], d[3]};
}

void check_shape_is(const TensorView& t, const char* name, const std::vector<int64_t>& expected, const char* what) {
  const bool same =
      t.ndim == static_cast<int>(expected.size()) && std::equal(expected.begin(), expected.end(), t.shape.begin());
  if (!same) {
    throw ValueError(std::string(name) + ": expected shape " + shape_str(expected) + " (" + what + "), got " +
                     t.shape_str());
  }
}

struct NamedView {
  const TensorView& view;
  const char* name;
};

void check_no_overlap(const TensorView& out, const NamedView& in) {
  if (!out.defined() || !in.view.defined()) return;
  const auto* a = static_cast<const char*>(out.data);
  const auto* b = static_cast<const char*>(in.view.data);
  if (a < b + in.view.nbytes() && b < a + out.nbytes()) {
    throw ValueError(std::string("out must not overlap ") + in.name + " (the op does not work in place)");
  }
}

TensorArgOptions host_only(int ndim) {
  return TensorArgOptions{ndim, false};
}

// An op's output argument. The constructor parses `out` when given and checks it against the expected shape and
// the inputs (no overlap), before any device access; ready() then checks every view's device (the first device
// access) and allocates `out` (output_alloc.h) when it was None.
class OutputArg {
 public:
  OutputArg(py::handle obj, DType dtype, std::vector<int64_t> shape, const char* what,
            std::initializer_list<NamedView> inputs)
      : obj_(obj), dtype_(dtype), shape_(std::move(shape)) {
    if (obj.is_none()) return;
    TensorArgOptions options = host_only(static_cast<int>(shape_.size()));
    options.writable = true;
    view_ = tensor_arg(obj, "out", dtype, options);
    check_shape_is(view_, "out", shape_, what);
    for (const NamedView& in : inputs) check_no_overlap(view_, in);
  }

  // The array to return; view() is valid after this.
  py::object ready(std::initializer_list<NamedView> inputs) {
    for (const NamedView& in : inputs) check_on_current_device(in.view, in.name);
    check_on_current_device(view_, "out");
    if (!obj_.is_none()) return py::reinterpret_borrow<py::object>(obj_);
    py::object result = new_device_array(shape_, dtype_, "out");
    view_ = tensor_arg(result, "out", dtype_, {static_cast<int>(shape_.size()), true});
    return result;
  }
  const TensorView& view() const { return view_; }

 private:
  py::handle obj_;
  DType dtype_;
  std::vector<int64_t> shape_;
  TensorView view_;
};

// The per-call fields of the key: the device and the workspace cap in force (both need a GPU).
void bind_to_current_device(ConvParams& p) {
  p.device = current_device();
  const size_t limit = WorkspacePool::current().limit();
  p.workspace_cap = limit == SIZE_MAX ? UINT64_MAX : static_cast<uint64_t>(limit);
}

// What the three convolution ops share once their inputs and key are validated: the output checked, the device
// checked, the output bound to its operand slot (`ops.*slot`), the convolution run.
py::object convolve(ConvParams params, ConvOperands ops, TensorView ConvOperands::* slot, OutputArg& out,
                    std::initializer_list<NamedView> inputs, bool allow_fusion, uintptr_t stream) {
  py::object result = out.ready(inputs);
  ops.*slot = out.view();
  bind_to_current_device(params);
  convolution(params, ops, allow_fusion, stream_arg(stream));
  return result;
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
  if (bias.defined()) check_shape_is(bias, "bias", {params.y[1]}, "one per output channel");
  if (z.defined()) check_shape_is(z, "z", y_shape, "the output's shape");
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
  const TensorView x = tensor_arg(x_obj, "x", dtype, host_only(4));
  const TensorView w = tensor_arg(w_obj, "w", dtype, host_only(4));
  const TensorView bias = optional_tensor_arg(bias_obj, "bias", dtype, host_only(1));
  const TensorView z = optional_tensor_arg(z_obj, "z", dtype, host_only(4));
  const uint8_t epilogue = epilogue_flags(bias.defined(), z.defined(), activation);
  const ConvParams params =
      make_conv_params(ConvDirection::Forward, spec, view_dims(x), view_dims(w), epilogue, "x", "w");
  const std::vector<int64_t> y_shape = as_vector(output_shape(params));
  ConvOperands ops = forward_operands(params, y_shape, x, w, bias, z);
  OutputArg out(out_obj, dtype, y_shape, "the convolution's output", {{x, "x"}, {w, "w"}, {z, "z"}, {bias, "bias"}});
  ops.alpha1 = alpha1;
  ops.alpha2 = alpha2;
  return convolve(params, ops, &ConvOperands::y, out, {{x, "x"}, {w, "w"}, {z, "z"}, {bias, "bias"}}, allow_fusion,
                  stream);
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
  const TensorView x = tensor_arg(x_obj, "x", dtype, host_only(4));
  const TensorView w = tensor_arg(w_obj, "w", dtype, host_only(4));
  const TensorView scale = tensor_arg(scale_obj, "scale", DType::F32, host_only(1));
  const TensorView bias = optional_tensor_arg(bias_obj, "bias", DType::F32, host_only(1));
  const TensorView z = optional_tensor_arg(z_obj, "z", dtype, host_only(4));
  const uint8_t epilogue =
      static_cast<uint8_t>(kEpilogueScale | epilogue_flags(bias.defined(), z.defined(), relu ? "relu" : "identity"));
  ConvParams params = make_conv_params(ConvDirection::Forward, spec, view_dims(x), view_dims(w), epilogue, "x", "w");
  params.out_dtype = y_dtype == dtype ? 0 : out_dtype_code(y_dtype);
  const std::vector<int64_t> y_shape = as_vector(output_shape(params));
  check_shape_is(scale, "scale", {params.y[1]}, "one per output channel");
  ConvOperands ops = forward_operands(params, y_shape, x, w, bias, z);
  const std::initializer_list<NamedView> inputs = {{x, "x"}, {w, "w"}, {z, "z"}, {bias, "bias"}, {scale, "scale"}};
  OutputArg out(out_obj, y_dtype, y_shape, "the convolution's output", inputs);
  ops.scale = scale;
  ops.alpha2 = gamma;
  return convolve(params, ops, &ConvOperands::y, out, inputs, true, stream);
}

py::object conv_backward_data(py::handle dy_obj, py::handle w_obj, py::handle out_obj, py::handle x_shape_obj,
                              bool accumulate, const ConvSpec& spec, uintptr_t stream) {
  const DType dtype = float_storage(spec);
  const Dims4 x_shape = ints_arg<4>(x_shape_obj, "x_shape");
  if (accumulate && out_obj.is_none()) {
    throw ValueError("accumulate: accumulating into the input gradient needs out= (the gradient to add to)");
  }
  const TensorView dy = tensor_arg(dy_obj, "dy", dtype, host_only(4));
  const TensorView w = tensor_arg(w_obj, "w", dtype, host_only(4));
  const ConvParams params =
      make_conv_params(ConvDirection::BackwardData, spec, x_shape, view_dims(w), kEpilogueNone, "x_shape", "w");
  check_shape_is(dy, "dy", as_vector(output_shape(params)), "the convolution's output");
  OutputArg out(out_obj, dtype, as_vector(x_shape), "x_shape", {{dy, "dy"}, {w, "w"}});
  ConvOperands ops;
  ops.w = w;
  ops.y = dy;
  ops.beta = accumulate ? 1.0f : 0.0f;
  return convolve(params, ops, &ConvOperands::x, out, {{dy, "dy"}, {w, "w"}}, true, stream);
}

py::object conv_backward_filter(py::handle x_obj, py::handle dy_obj, py::handle out_obj, py::handle w_shape_obj,
                                bool accumulate, const ConvSpec& spec, uintptr_t stream) {
  const DType dtype = float_storage(spec);
  const Dims4 w_shape = ints_arg<4>(w_shape_obj, "w_shape");
  if (accumulate && out_obj.is_none()) {
    throw ValueError("accumulate: accumulating into the gradient needs out= (the existing dw)");
  }
  const TensorView x = tensor_arg(x_obj, "x", dtype, host_only(4));
  const TensorView dy = tensor_arg(dy_obj, "dy", dtype, host_only(4));
  const ConvParams params =
      make_conv_params(ConvDirection::BackwardFilter, spec, view_dims(x), w_shape, kEpilogueNone, "x", "w_shape");
  check_shape_is(dy, "dy", as_vector(output_shape(params)), "the convolution's output");
  OutputArg out(out_obj, dtype, as_vector(w_shape), "w_shape", {{x, "x"}, {dy, "dy"}});
  ConvOperands ops;
  ops.x = x;
  ops.y = dy;
  ops.beta = accumulate ? 1.0f : 0.0f;
  return convolve(params, ops, &ConvOperands::w, out, {{x, "x"}, {dy, "dy"}}, true, stream);
}

std::string describe_backward_bias(const void* data) {
  return "conv2d_backward_bias dy" + static_cast<const TensorView*>(data)->describe();
}

py::object conv_backward_bias(py::handle dy_obj, py::handle out_obj, Layout layout, DType dtype, uintptr_t stream) {
  const TensorView dy = tensor_arg(dy_obj, "dy", dtype, host_only(4));
  check_int32_shape(view_dims(dy), "dy");
  const int64_t k = logical_dims(view_dims(dy), layout)[1];
  OutputArg out(out_obj, dtype, {k}, "one per channel of dy", {{dy, "dy"}});
  py::object result = out.ready({{dy, "dy"}});
  OpContext context(&describe_backward_bias, &dy);
  legacy::backward_bias(dy, out.view(), layout, cudnn_handle(stream_arg(stream)));
  return result;
}

py::tuple output_shape_of(py::handle x_shape_obj, py::handle w_shape_obj, const ConvSpec& spec) {
  const Dims4 y =
      output_shape(make_conv_params(ConvDirection::Forward, spec, ints_arg<4>(x_shape_obj, "x_shape"),
                                    ints_arg<4>(w_shape_obj, "w_shape"), kEpilogueNone, "x_shape", "w_shape"));
  return py::make_tuple(y[0], y[1], y[2], y[3]);
}

// The key an op would use (last_algorithm): device and workspace cap as they are now.
std::string conv_key(ConvDirection direction, py::handle x_shape_obj, py::handle w_shape_obj, const ConvSpec& spec,
                     const std::string& epilogue) {
  const uint8_t flags = parse_epilogue(epilogue);
  if (flags != kEpilogueNone && direction != ConvDirection::Forward) {
    throw ValueError("fused: only forward convolutions have an epilogue");
  }
  ConvParams params = make_conv_params(direction, spec, ints_arg<4>(x_shape_obj, "x_shape"),
                                       ints_arg<4>(w_shape_obj, "w_shape"), flags, "x_shape", "w_shape");
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
             return ConvSpec::make(ints_arg<2>(stride, "stride"), ints_arg<2>(padding, "padding"),
                                   ints_arg<2>(dilation, "dilation"), int_arg(groups, "groups"), layout, precision,
                                   engine, algo_mode, int_arg(fixed_algo, "algo"), deterministic);
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
  m.def(
      "_probe_legacy_int8x32",
      [](int n, int c, int h, int w, int k, int r, int stride, int pad, bool int8_out, int runs) {
        if (n < 1 || c < 32 || c % 32 || k < 32 || k % 32 || h < 1 || w < 1 || r < 1 || stride < 1 || pad < 0 ||
            runs < 1) {
          throw ValueError("_probe_legacy_int8x32: expected positive sizes with c and k multiples of 32");
        }
        const legacy::Int8x32Probe p = legacy::probe_int8x32(n, c, h, w, k, r, stride, pad, int8_out, runs);
        py::dict d;
        d["supported"] = p.supported;
        d["error"] = p.error;
        d["ms"] = p.ms;
        d["workspace"] = p.workspace;
        return d;
      },
      py::arg("n"), py::arg("c"), py::arg("h"), py::arg("w"), py::arg("k"), py::arg("r"), py::arg("stride"),
      py::arg("pad"), py::arg("int8_out"), py::arg("runs"),
      "A measurement (tools/probe_quantized.py): the legacy INT8x32 conv + bias + ReLU on zeros, {supported, "
      "error, ms, workspace}. Allocates and synchronises.");
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
