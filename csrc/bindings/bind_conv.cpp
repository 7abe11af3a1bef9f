// Python bindings of the convolution engine (resnet_native/conv.py wraps them).
//
// Every op validates all of its arguments (types, dtypes, ranks, shapes, geometry, aliasing) before it touches
// the device: arrays are first parsed without the device check, the output is allocated with cupy only when
// the inputs are valid, and only then are pointers checked against the current device and the op run.
// Each array is parsed once per call (the device check runs on the parsed views): these ops are called per
// layer and direction, and with small problems their host time is the step time.
// A spec arrives as a tuple resolved by conv.py for one direction:
//   (stride, padding, dilation, groups, layout, precision, engine, algo_mode, fixed_algo, deterministic)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "../conv/algo_cache.h"
#include "../conv/conv_dispatch.h"
#include "../conv/conv_params.h"
#include "../conv/legacy_descriptors.h"
#include "../conv/legacy_engine.h"
#include "../core/device.h"
#include "../core/error.h"
#include "../core/workspace.h"
#include "bindings.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace rn {
namespace {

struct SpecArgs {
  std::array<int64_t, 2> stride{}, padding{}, dilation{};
  int64_t groups = 1;
  Layout layout = Layout::NCHW;
  Precision precision = Precision::FP32;
  ConvEngineKind engine = ConvEngineKind::Legacy;
  AlgoMode mode = AlgoMode::Find;
  int32_t fixed_algo = 0;
  bool deterministic = false;
};

using Dims = std::array<int64_t, 4>;

std::string dims_str(const Dims& d) {
  return "(" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) + ", " +
         std::to_string(d[3]) + ")";
}

int64_t int_arg(py::handle obj, const std::string& name) {
  if (!py::isinstance<py::int_>(obj) || py::isinstance<py::bool_>(obj)) {
    throw TypeError(name + ": expected an int, got " + std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  return obj.cast<int64_t>();
}

std::array<int64_t, 2> pair_arg(py::handle obj, const char* name) {
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  if (!py::isinstance<py::sequence>(obj) || py::len(seq) != 2) {
    throw ValueError(std::string(name) + ": expected two ints, got " + std::string(py::repr(obj)));
  }
  return {int_arg(seq[0], name), int_arg(seq[1], name)};
}

// A shape given as a tuple of 4 ints (x_shape, w_shape), each >= 1.
Dims shape_arg(py::handle obj, const char* name) {
  if (!py::isinstance<py::sequence>(obj) || py::len(obj) != 4) {
    throw ValueError(std::string(name) + ": expected a tuple of 4 ints, got " + std::string(py::repr(obj)));
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  Dims d{};
  for (int i = 0; i < 4; ++i) {
    d[i] = int_arg(seq[i], name);
    if (d[i] < 1) throw ValueError(std::string(name) + ": every dimension must be >= 1, got " + dims_str(d));
  }
  return d;
}

SpecArgs parse_spec(const py::tuple& t) {
  if (t.size() != 10) throw ValueError("spec: expected a 10-tuple from resnet_native.conv");
  SpecArgs s;
  s.stride = pair_arg(t[0], "stride");
  s.padding = pair_arg(t[1], "padding");
  s.dilation = pair_arg(t[2], "dilation");
  s.groups = int_arg(t[3], "groups");
  s.layout = parse_layout(t[4].cast<std::string>());
  s.precision = parse_precision(t[5].cast<std::string>());
  s.engine = parse_engine(t[6].cast<std::string>());
  s.mode = parse_algo_mode(t[7].cast<std::string>());
  s.fixed_algo = static_cast<int32_t>(int_arg(t[8], "algo"));
  s.deterministic = t[9].cast<bool>();
  for (int i = 0; i < 2; ++i) {
    if (s.stride[i] < 1) throw ValueError("stride: must be >= 1, got " + std::to_string(s.stride[i]));
    if (s.dilation[i] < 1) throw ValueError("dilation: must be >= 1, got " + std::to_string(s.dilation[i]));
    if (s.padding[i] < 0) throw ValueError("padding: must be >= 0, got " + std::to_string(s.padding[i]));
    if (s.stride[i] > INT32_MAX || s.dilation[i] > INT32_MAX || s.padding[i] > INT32_MAX) {
      throw ValueError("stride/padding/dilation: too large");
    }
  }
  if (s.groups < 1 || s.groups > INT32_MAX) throw ValueError("groups: must be >= 1, got " + std::to_string(s.groups));
  return s;
}

// Logical (N, C, H, W) of an activation shape given in the layout's order.
Dims activation_nchw(const Dims& s, Layout layout) {
  return layout == Layout::NCHW ? s : Dims{s[0], s[3], s[1], s[2]};
}
// The layout's order of a logical (N, C, H, W).
Dims activation_in_layout(const Dims& n, Layout layout) {
  return layout == Layout::NCHW ? n : Dims{n[0], n[2], n[3], n[1]};
}
// Filters: NCHW (K, C/g, R, S), NHWC (K, R, S, C/g).
Dims filter_kcrs(const Dims& s, Layout layout) {
  return layout == Layout::NCHW ? s : Dims{s[0], s[3], s[1], s[2]};
}
Dims filter_in_layout(const Dims& k, Layout layout) {
  return layout == Layout::NCHW ? k : Dims{k[0], k[2], k[3], k[1]};
}

Dims view_dims(const TensorView& v) {
  return {v.shape[0], v.shape[1], v.shape[2], v.shape[3]};
}

void check_int32_elements(const Dims& d, const char* name) {
  const int64_t n = d[0] * d[1] * d[2] * d[3];
  if (n > INT32_MAX) {
    throw ValueError(std::string(name) + ": " + std::to_string(n) + " elements " + dims_str(d) +
                     " exceed cuDNN's 32-bit indexing of the legacy API");
  }
}

// Validates the convolution of logical input x (N, C, H, W) and filter w (K, C/g, R, S) and builds its key.
// `x_name`/`w_name` name the arguments the shapes came from.
ConvParams make_params(ConvDirection direction, const SpecArgs& s, const Dims& x, const Dims& w, uint8_t epilogue,
                       const char* x_name, const char* w_name) {
  const int64_t groups = s.groups;
  if (x[1] % groups != 0) {
    throw ValueError(std::string(x_name) + ": C=" + std::to_string(x[1]) +
                     " input channels are not divisible by groups=" + std::to_string(groups));
  }
  if (w[1] != x[1] / groups) {
    throw ValueError(std::string(w_name) + ": expected " + std::to_string(x[1] / groups) +
                     " input channels per group (" + x_name + " has C=" + std::to_string(x[1]) +
                     ", groups=" + std::to_string(groups) + "), the filter has " + std::to_string(w[1]) +
                     " (filter K, C/groups, R, S = " + dims_str(w) + ")");
  }
  if (w[0] % groups != 0) {
    throw ValueError(std::string(w_name) + ": K=" + std::to_string(w[0]) +
                     " output channels are not divisible by groups=" + std::to_string(groups));
  }
  Dims y{x[0], w[0], 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t padded = x[2 + i] + 2 * s.padding[i];
    const int64_t extent = (w[2 + i] - 1) * s.dilation[i] + 1;
    if (padded < extent) {
      throw ValueError(std::string(x_name) + ": the padded input " + (i == 0 ? "height " : "width ") +
                       std::to_string(padded) + " is smaller than the dilated filter extent " + std::to_string(extent) +
                       " (" + x_name + " N, C, H, W = " + dims_str(x) + ", filter " + dims_str(w) + ")");
    }
    y[2 + i] = (padded - extent) / s.stride[i] + 1;
  }
  check_int32_elements(x, x_name);
  check_int32_elements(w, w_name);
  check_int32_elements(y, "output");
  ConvParams p;
  p.direction = static_cast<uint8_t>(direction);
  p.precision = static_cast<uint8_t>(s.precision);
  p.layout = static_cast<uint8_t>(s.layout);
  p.engine = static_cast<uint8_t>(s.engine);
  p.epilogue = epilogue;
  p.deterministic = s.deterministic ? 1 : 0;
  p.algo_mode = static_cast<uint8_t>(s.mode);
  p.fixed_algo = s.mode == AlgoMode::Fixed ? s.fixed_algo : 0;
  for (int i = 0; i < 4; ++i) {
    p.x[i] = static_cast<int32_t>(x[i]);
    p.w[i] = static_cast<int32_t>(w[i]);
    p.y[i] = static_cast<int32_t>(y[i]);
  }
  for (int i = 0; i < 2; ++i) {
    p.pad[i] = static_cast<int32_t>(s.padding[i]);
    p.stride[i] = static_cast<int32_t>(s.stride[i]);
    p.dilation[i] = static_cast<int32_t>(s.dilation[i]);
  }
  p.groups = static_cast<int32_t>(groups);
  return p;
}

Dims output_nchw(const ConvParams& p) {
  return {p.y[0], p.y[1], p.y[2], p.y[3]};
}

// The per-call fields of the key: the device and the workspace cap in force (both need a GPU).
void bind_to_current_device(ConvParams& p) {
  p.device = current_device();
  const size_t limit = WorkspacePool::current().limit();
  p.workspace_cap = limit == SIZE_MAX ? UINT64_MAX : static_cast<uint64_t>(limit);
  p.engine = static_cast<uint8_t>(resolve_engine(static_cast<ConvEngineKind>(p.engine)));
}

void check_shape_is(const TensorView& t, const char* name, const Dims& expected, const char* what) {
  if (view_dims(t) != expected) {
    throw ValueError(std::string(name) + ": expected shape " + dims_str(expected) + " (" + what + "), got " +
                     t.shape_str());
  }
}

void check_no_overlap(const TensorView& out, const char* out_name, const TensorView& in, const char* in_name) {
  if (!out.defined() || !in.defined()) return;
  const auto* a = static_cast<const char*>(out.data);
  const auto* b = static_cast<const char*>(in.data);
  if (a < b + in.nbytes() && b < a + out.nbytes()) {
    throw ValueError(std::string(out_name) + " must not overlap " + in_name + " (the op does not work in place)");
  }
}

const char* numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "float32";
    case DType::F16:
      return "float16";
    case DType::BF16:
      return "uint16";  // bf16 bit patterns: cupy has no bfloat16
  }
  return "float32";
}

// cupy.empty, imported on first use and kept (py::module_::import per call goes through __import__).
const py::object& cupy_empty() {
  static const py::object* empty = new py::object(py::module_::import("cupy").attr("empty"));  // never freed
  return *empty;
}

// `out` as given, or a new cupy array (only called once every input is known to be valid).
py::object output_or_new(py::handle out, const std::vector<int64_t>& shape, DType dtype) {
  if (!out.is_none()) return py::reinterpret_borrow<py::object>(out);
  py::tuple t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t[i] = shape[i];
  return cupy_empty()(t, py::arg("dtype") = numpy_dtype(dtype));
}

std::vector<int64_t> as_vector(const Dims& d) {
  return {d[0], d[1], d[2], d[3]};
}

struct NamedView {
  const TensorView& view;
  const char* name;
};

// After every host-side check: the device check of the parsed views (undefined ones skipped), in order; the
// first access to the device.
void check_on_device(std::initializer_list<NamedView> views) {
  for (const NamedView& v : views) check_on_current_device(v.view, v.name);
}

TensorArgOptions host_only(int ndim) {
  return TensorArgOptions{ndim, false};
}

uint8_t epilogue_flags(bool bias, bool z, const std::string& activation) {
  if (activation != "identity" && activation != "relu") {
    throw ValueError("activation: expected 'identity' or 'relu', got '" + activation + "'");
  }
  return static_cast<uint8_t>((bias ? kEpilogueBias : 0) | (z ? kEpilogueResidual : 0) |
                              (activation == "relu" ? kEpilogueRelu : 0));
}

py::object conv_forward(py::handle x_obj, py::handle w_obj, py::handle out_obj, py::handle bias_obj, py::handle z_obj,
                        const py::tuple& spec_tuple, const std::string& activation, float alpha1, float alpha2,
                        bool allow_fusion, uintptr_t stream) {
  const SpecArgs spec = parse_spec(spec_tuple);
  const DType dtype = storage_dtype(spec.precision);
  const TensorView x = tensor_arg(x_obj, "x", dtype, host_only(4));
  const TensorView w = tensor_arg(w_obj, "w", dtype, host_only(4));
  const TensorView bias = optional_tensor_arg(bias_obj, "bias", dtype, host_only(1));
  const TensorView z = optional_tensor_arg(z_obj, "z", dtype, host_only(4));
  const uint8_t epilogue = epilogue_flags(bias.defined(), z.defined(), activation);
  ConvParams params = make_params(ConvDirection::Forward, spec, activation_nchw(view_dims(x), spec.layout),
                                  filter_kcrs(view_dims(w), spec.layout), epilogue, "x", "w");
  const Dims y_shape = activation_in_layout(output_nchw(params), spec.layout);
  if (bias.defined() && bias.shape[0] != params.y[1]) {
    throw ValueError("bias: expected shape (" + std::to_string(params.y[1]) + ",) (one per output channel), got " +
                     bias.shape_str());
  }
  if (z.defined()) check_shape_is(z, "z", y_shape, "the output's shape");
  TensorView out;
  if (!out_obj.is_none()) {
    out = tensor_arg(out_obj, "out", dtype, host_only(4));
    check_shape_is(out, "out", y_shape, "the convolution's output");
    check_no_overlap(out, "out", x, "x");
    check_no_overlap(out, "out", w, "w");
    check_no_overlap(out, "out", z, "z");
    check_no_overlap(out, "out", bias, "bias");
  }
  check_on_device({{x, "x"}, {w, "w"}, {z, "z"}, {out, "out"}, {bias, "bias"}});
  py::object result = output_or_new(out_obj, as_vector(y_shape), dtype);
  if (out_obj.is_none()) out = tensor_arg(result, "out", dtype, {4, true});

  bind_to_current_device(params);
  ConvOperands ops;
  ops.x = x;
  ops.w = w;
  ops.y = out;
  ops.bias = bias;
  ops.z = z;
  ops.alpha1 = alpha1;
  ops.alpha2 = alpha2;
  convolution(params, ops, allow_fusion, stream_arg(stream));
  return result;
}

py::object conv_backward_data(py::handle dy_obj, py::handle w_obj, py::handle out_obj, py::handle x_shape_obj,
                              const py::tuple& spec_tuple, uintptr_t stream) {
  const SpecArgs spec = parse_spec(spec_tuple);
  const DType dtype = storage_dtype(spec.precision);
  const Dims x_shape = shape_arg(x_shape_obj, "x_shape");
  const TensorView dy = tensor_arg(dy_obj, "dy", dtype, host_only(4));
  const TensorView w = tensor_arg(w_obj, "w", dtype, host_only(4));
  ConvParams params = make_params(ConvDirection::BackwardData, spec, activation_nchw(x_shape, spec.layout),
                                  filter_kcrs(view_dims(w), spec.layout), kEpilogueNone, "x_shape", "w");
  check_shape_is(dy, "dy", activation_in_layout(output_nchw(params), spec.layout), "the convolution's output");
  TensorView out;
  if (!out_obj.is_none()) {
    out = tensor_arg(out_obj, "out", dtype, host_only(4));
    check_shape_is(out, "out", x_shape, "x_shape");
    check_no_overlap(out, "out", dy, "dy");
    check_no_overlap(out, "out", w, "w");
  }
  check_on_device({{dy, "dy"}, {w, "w"}, {out, "out"}});
  py::object result = output_or_new(out_obj, as_vector(x_shape), dtype);
  if (out_obj.is_none()) out = tensor_arg(result, "out", dtype, {4, true});

  bind_to_current_device(params);
  ConvOperands ops;
  ops.x = out;
  ops.w = w;
  ops.y = dy;
  convolution(params, ops, true, stream_arg(stream));
  return result;
}

py::object conv_backward_filter(py::handle x_obj, py::handle dy_obj, py::handle out_obj, py::handle w_shape_obj,
                                bool accumulate, const py::tuple& spec_tuple, uintptr_t stream) {
  const SpecArgs spec = parse_spec(spec_tuple);
  const DType dtype = storage_dtype(spec.precision);
  const Dims w_shape = shape_arg(w_shape_obj, "w_shape");
  if (accumulate && out_obj.is_none()) {
    throw ValueError("accumulate: accumulating into the gradient needs out= (the existing dw)");
  }
  const TensorView x = tensor_arg(x_obj, "x", dtype, host_only(4));
  const TensorView dy = tensor_arg(dy_obj, "dy", dtype, host_only(4));
  ConvParams params = make_params(ConvDirection::BackwardFilter, spec, activation_nchw(view_dims(x), spec.layout),
                                  filter_kcrs(w_shape, spec.layout), kEpilogueNone, "x", "w_shape");
  check_shape_is(dy, "dy", activation_in_layout(output_nchw(params), spec.layout), "the convolution's output");
  TensorView out;
  if (!out_obj.is_none()) {
    out = tensor_arg(out_obj, "out", dtype, host_only(4));
    check_shape_is(out, "out", w_shape, "w_shape");
    check_no_overlap(out, "out", x, "x");
    check_no_overlap(out, "out", dy, "dy");
  }
  check_on_device({{x, "x"}, {dy, "dy"}, {out, "out"}});
  py::object result = output_or_new(out_obj, as_vector(w_shape), dtype);
  if (out_obj.is_none()) out = tensor_arg(result, "out", dtype, {4, true});

  bind_to_current_device(params);
  ConvOperands ops;
  ops.x = x;
  ops.w = out;
  ops.y = dy;
  ops.beta = accumulate ? 1.0f : 0.0f;
  convolution(params, ops, true, stream_arg(stream));
  return result;
}

std::string describe_backward_bias(const void* data) {
  return "conv2d_backward_bias dy" + static_cast<const TensorView*>(data)->describe();
}

py::object conv_backward_bias(py::handle dy_obj, py::handle out_obj, const std::string& layout_name,
                              const std::string& dtype_name, uintptr_t stream) {
  const Layout layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  const TensorView dy = tensor_arg(dy_obj, "dy", dtype, host_only(4));
  const int64_t k = activation_nchw(view_dims(dy), layout)[1];
  TensorView out;
  if (!out_obj.is_none()) {
    out = tensor_arg(out_obj, "out", dtype, host_only(1));
    if (out.shape[0] != k) {
      throw ValueError("out: expected shape (" + std::to_string(k) + ",) (one per channel of dy), got " +
                       out.shape_str());
    }
    check_no_overlap(out, "out", dy, "dy");
  }
  check_on_device({{dy, "dy"}, {out, "out"}});
  py::object result = output_or_new(out_obj, {k}, dtype);
  if (out_obj.is_none()) out = tensor_arg(result, "out", dtype, {1, true});
  OpContext context(&describe_backward_bias, &dy);
  legacy::backward_bias(dy, out, layout, cudnn_handle(stream_arg(stream)));
  return result;
}

py::tuple output_shape(py::handle x_shape_obj, py::handle w_shape_obj, const py::tuple& spec_tuple) {
  const SpecArgs spec = parse_spec(spec_tuple);
  const ConvParams params =
      make_params(ConvDirection::Forward, spec, activation_nchw(shape_arg(x_shape_obj, "x_shape"), spec.layout),
                  filter_kcrs(shape_arg(w_shape_obj, "w_shape"), spec.layout), kEpilogueNone, "x_shape", "w_shape");
  const std::array<int, 4> dims = legacy::output_dims(params);  // cuDNN's own arithmetic; no GPU needed
  const Dims in_layout = activation_in_layout({dims[0], dims[1], dims[2], dims[3]}, spec.layout);
  return py::make_tuple(in_layout[0], in_layout[1], in_layout[2], in_layout[3]);
}

// The key an op would use (last_algorithm): device and workspace cap as they are now.
std::string conv_key(const std::string& direction, py::handle x_shape_obj, py::handle w_shape_obj,
                     const py::tuple& spec_tuple, const std::string& epilogue) {
  const SpecArgs spec = parse_spec(spec_tuple);
  const ConvDirection dir = parse_direction(direction);
  const uint8_t flags = parse_epilogue(epilogue);
  if (flags != kEpilogueNone && dir != ConvDirection::Forward) {
    throw ValueError("fused: only forward convolutions have an epilogue");
  }
  ConvParams params =
      make_params(dir, spec, activation_nchw(shape_arg(x_shape_obj, "x_shape"), spec.layout),
                  filter_kcrs(shape_arg(w_shape_obj, "w_shape"), spec.layout), flags, "x_shape", "w_shape");
  if (device_count() > 0) {
    bind_to_current_device(params);
  } else {
    params.workspace_cap = workspace_limit() == SIZE_MAX ? UINT64_MAX : workspace_limit();
    params.engine = static_cast<uint8_t>(resolve_engine(spec.engine));
  }
  return params.to_string();
}

std::string algo_display_name(const ConvParams& params, const AlgoChoice& c) {
  if (static_cast<ConvEngineKind>(c.engine) == ConvEngineKind::Graph) return "ENGINE_" + std::to_string(c.algo);
  return legacy::algo_name(static_cast<ConvDirection>(params.direction), c.algo);
}

py::dict choice_to_dict(const ConvParams& params, const AlgoChoice& c) {
  py::dict d;
  d["engine"] = engine_name(static_cast<ConvEngineKind>(c.engine));
  d["mode"] = algo_mode_name(static_cast<AlgoMode>(c.mode));
  d["algo"] = c.algo;
  d["algo_name"] = algo_display_name(params, c);
  d["math_type"] = c.math_type;
  d["math_type_name"] = legacy::math_type_name(c.math_type);
  d["knobs"] = c.knobs;
  d["workspace"] = c.workspace;
  d["time_ms"] = c.time_ms < 0 ? py::object(py::none()) : py::object(py::float_(c.time_ms));
  d["fused_path"] = c.fused_path;
  return d;
}

template <class T>
T required(const py::dict& d, const char* key) {
  if (!d.contains(key)) throw ValueError(std::string("choice: missing field '") + key + "'");
  try {
    return d[key].cast<T>();
  } catch (const py::cast_error&) {
    throw ValueError(std::string("choice: field '") + key + "' has the wrong type");
  }
}

AlgoChoice choice_from_dict(const py::dict& d) {
  AlgoChoice c;
  c.engine = static_cast<uint8_t>(parse_engine(required<std::string>(d, "engine")));
  c.mode = static_cast<uint8_t>(parse_algo_mode(required<std::string>(d, "mode")));
  c.algo = required<int32_t>(d, "algo");
  c.math_type = required<int32_t>(d, "math_type");
  c.workspace = required<uint64_t>(d, "workspace");
  if (static_cast<ConvEngineKind>(c.engine) == ConvEngineKind::Auto)
    throw ValueError("choice: engine must be concrete");
  if (d.contains("knobs")) c.knobs = required<std::string>(d, "knobs");
  if (d.contains("fused_path")) c.fused_path = required<std::string>(d, "fused_path");
  if (d.contains("time_ms") && !d["time_ms"].is_none()) c.time_ms = required<float>(d, "time_ms");
  return c;
}

py::dict stats_dict(const AlgoCacheStats& s) {
  py::dict d;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["finds"] = s.finds;
  d["entries"] = s.entries;
  return d;
}

}  // namespace

void bind_conv(py::module_& m) {
  m.attr("HAVE_GRAPH_ENGINE") = graph_engine_available();
  m.def("conv_forward", &conv_forward, py::arg("x"), py::arg("w"), py::arg("out"), py::arg("bias"), py::arg("z"),
        py::arg("spec"), py::arg("activation"), py::arg("alpha1"), py::arg("alpha2"), py::arg("allow_fusion"),
        py::arg("stream"), "y = act(alpha1 * conv(x, w) + alpha2 * z + bias); returns out (allocated when None).");
  m.def("conv_backward_data", &conv_backward_data, py::arg("dy"), py::arg("w"), py::arg("out"), py::arg("x_shape"),
        py::arg("spec"), py::arg("stream"), "dx of a convolution; returns out (allocated when None).");
  m.def("conv_backward_filter", &conv_backward_filter, py::arg("x"), py::arg("dy"), py::arg("out"), py::arg("w_shape"),
        py::arg("accumulate"), py::arg("spec"), py::arg("stream"),
        "dw of a convolution (added to out when accumulate); returns out (allocated when None).");
  m.def("conv_backward_bias", &conv_backward_bias, py::arg("dy"), py::arg("out"), py::arg("layout"), py::arg("dtype"),
        py::arg("stream"), "db = sum of dy over N, H, W; returns out (allocated when None).");
  m.def("conv_output_shape", &output_shape, py::arg("x_shape"), py::arg("w_shape"), py::arg("spec"),
        "Output shape in the spec's layout, from cudnnGetConvolution2dForwardOutputDim (no GPU needed).");
  m.def("conv_key", &conv_key, py::arg("direction"), py::arg("x_shape"), py::arg("w_shape"), py::arg("spec"),
        py::arg("epilogue"), "The algorithm-cache key an op with these arguments uses now.");
  m.def(
      "conv_algo_names", [](const std::string& direction) { return legacy::algo_names(parse_direction(direction)); },
      py::arg("direction"), "The legacy engine's algorithm names of a direction, indexed by cuDNN's enum value.");
  m.def(
      "conv_algo_is_deterministic",
      [](const std::string& direction, int algo) {
        return legacy::algo_is_deterministic(parse_direction(direction), algo);
      },
      py::arg("direction"), py::arg("algo"));

  m.def(
      "algo_cache_lookup",
      [](const std::string& key) -> py::object {
        const ConvParams params = ConvParams::from_string(key);
        AlgoCache::Entry e = AlgoCache::global().peek(params);
        return e ? py::object(choice_to_dict(params, *e)) : py::object(py::none());
      },
      py::arg("key"), "The cached choice of a key (dict) or None; counts neither a hit nor a miss.");
  m.def(
      "algo_cache_entries",
      [] {
        py::list out;
        for (const auto& [params, entry] : AlgoCache::global().entries()) {
          out.append(py::make_tuple(params.to_string(), choice_to_dict(params, *entry)));
        }
        return out;
      },
      "Every cached (key, choice) pair.");
  m.def(
      "algo_cache_insert",
      [](const std::string& key, const py::dict& choice, int device) {
        ConvParams params = ConvParams::from_string(key);
        if (device >= 0) params.device = device;
        AlgoCache::global().insert(params, choice_from_dict(choice));
      },
      py::arg("key"), py::arg("choice"), py::arg("device") = -1,
      "Insert or replace an entry (device >= 0 re-keys it to that device).");
  m.def("algo_cache_clear", [] { AlgoCache::global().clear(); });
  m.def(
      "algo_cache_stats", [] { return stats_dict(AlgoCache::global().stats()); },
      "hits, misses, finds (timed searches run) and entries.");

  m.def("drop_cached_descriptors", &drop_cached_descriptors,
        "Destroy every cached cuDNN descriptor and execution plan (both engines); they are rebuilt on demand.");
  m.def("_legacy_descriptor_cache_size", &legacy::descriptor_cache_size);
  m.def(
      "_build_legacy_descriptors",
      [](const std::string& key, bool cached) {
        const ConvParams params = ConvParams::from_string(key);
        const cudnnMathType_t math = cudnn_math_type(static_cast<Precision>(params.precision));
        if (cached) {
          legacy::descriptors(params, math);
        } else {
          legacy::ConvDescriptors group(params, math);
        }
      },
      py::arg("key"), py::arg("cached") = false,
      "Build the legacy descriptor group of a key (tests: a failure half-way must leak nothing).");
  m.def(
      "_conv_params_roundtrip", [](const std::string& key) { return ConvParams::from_string(key).to_string(); },
      py::arg("key"));
  m.def(
      "_conv_params_equal",
      [](const std::string& a, const std::string& b) {
        return ConvParams::from_string(a) == ConvParams::from_string(b);
      },
      py::arg("a"), py::arg("b"));
  m.def(
      "_conv_params_hash", [](const std::string& key) { return ConvParamsHash()(ConvParams::from_string(key)); },
      py::arg("key"));
}

}  // namespace rn
