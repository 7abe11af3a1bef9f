// Python bindings of the graph engine's own pieces: the plan cache (count / clear) and test hooks that build
// operation graphs without a GPU. Convolutions themselves are called through the shared conv bindings
// (bind_conv.cpp), which dispatch to rn::graph::choose / run for engine='graph'.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "../../bindings/bindings.h"
#include "../../bindings/tensor_arg.h"
#include "../../core/error.h"
#include "../graph_engine.h"
#include "conv_op_graph.h"
#include "engine_config.h"
#include "engine_search.h"

namespace py = pybind11;

namespace rn {
namespace {

using Quad = std::tuple<int, int, int, int>;
using Pair = std::tuple<int, int>;

ConvDirection parse_direction_arg(const std::string& name) {
  if (name == "forward") return ConvDirection::Forward;
  if (name == "backward_data") return ConvDirection::BackwardData;
  if (name == "backward_filter") return ConvDirection::BackwardFilter;
  throw ValueError("direction: expected 'forward', 'backward_data' or 'backward_filter', got '" + name + "'");
}

uint8_t parse_epilogue_arg(const std::string& text) {
  uint8_t flags = kEpilogueNone;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('+', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    if (item == "bias") {
      flags |= kEpilogueBias;
    } else if (item == "residual") {
      flags |= kEpilogueResidual;
    } else if (item == "relu") {
      flags |= kEpilogueRelu;
    } else if (item != "none") {
      throw ValueError("epilogue: unknown part '" + item + "' (expected bias, residual, relu joined by '+')");
    }
    start = end + 1;
  }
  return flags;
}

void set4(int32_t* out, const Quad& q) {
  out[0] = std::get<0>(q);
  out[1] = std::get<1>(q);
  out[2] = std::get<2>(q);
  out[3] = std::get<3>(q);
}

void set2(int32_t* out, const Pair& p) {
  out[0] = std::get<0>(p);
  out[1] = std::get<1>(p);
}

// A ConvParams from Python values; shapes are logical: x (N, C, H, W), w (K, C/groups, R, S), y (N, K, P, Q).
// y = None computes the output shape.
ConvParams make_params(const std::string& direction, const std::string& precision, const std::string& layout,
                       const Quad& x, const Quad& w, const py::object& y, const Pair& pad, const Pair& stride,
                       const Pair& dilation, int groups, const std::string& epilogue, bool deterministic) {
  ConvParams p;
  p.device = 0;
  p.direction = static_cast<uint8_t>(parse_direction_arg(direction));
  p.precision = static_cast<uint8_t>(parse_precision(precision));
  p.layout = static_cast<uint8_t>(parse_layout(layout));
  p.engine = static_cast<uint8_t>(ConvEngineKind::Graph);
  p.epilogue = parse_epilogue_arg(epilogue);
  p.deterministic = deterministic ? 1 : 0;
  set4(p.x, x);
  set4(p.w, w);
  set2(p.pad, pad);
  set2(p.stride, stride);
  set2(p.dilation, dilation);
  p.groups = groups;
  p.workspace_cap = UINT64_MAX;
  if (y.is_none()) {
    p.y[0] = p.x[0];
    p.y[1] = p.w[0];
    for (int i = 0; i < 2; ++i) {
      const int extent = p.dilation[i] * (p.w[2 + i] - 1) + 1;
      p.y[2 + i] = (p.x[2 + i] + 2 * p.pad[i] - extent) / std::max(p.stride[i], 1) + 1;
    }
  } else {
    set4(p.y, y.cast<Quad>());
  }
  return p;
}

const char* type_name(cudnnBackendDescriptorType_t type) {
  switch (type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      return "tensor";
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
      return "convolution";
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      return "pointwise";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
      return "op_conv_forward";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
      return "op_conv_backward_data";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
      return "op_conv_backward_filter";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
      return "op_pointwise";
    default:
      return "other";
  }
}

// Builds every tensor, descriptor and operation of a problem (no operation graph: that needs a handle), reports
// what was built, and destroys it all on return.
py::dict build_operations(const std::string& direction, const std::string& precision, const std::string& layout,
                          const Quad& x, const Quad& w, const py::object& y, const Pair& pad, const Pair& stride,
                          const Pair& dilation, int groups, const std::string& epilogue, float alpha1, float alpha2,
                          float beta, bool validate, int fail_after_parts) {
  const ConvParams p =
      make_params(direction, precision, layout, x, w, y, pad, stride, dilation, groups, epilogue, false);
  // Errors name the problem, as they do in choose() / run().
  OpContext context([](const void* params) { return graph::describe_problem(*static_cast<const ConvParams*>(params)); },
                    &p);
  graph::GraphConstants constants;
  constants.alpha1 = alpha1;
  constants.alpha2 = alpha2;
  constants.beta = beta;
  const graph::ConvOpGraph g = graph::build_conv_operations(p, constants, validate, fail_after_parts);
  py::dict parts;
  for (auto type : g.part_types) {
    const char* name = type_name(type);
    parts[name] = (parts.contains(name) ? parts[name].cast<int>() : 0) + 1;
  }
  py::dict out;
  out["parts"] = parts;
  out["num_parts"] = g.parts.size();
  out["num_operations"] = g.operations.size();
  out["io_uids"] = g.io_uids;
  out["problem"] = graph::describe_problem(p);
  return out;
}

}  // namespace

void bind_graph_engine(py::module_& m) {
  m.def("graph_num_plans", &graph::num_plans, "Number of execution plans the graph engine holds.");
  m.def("graph_clear_plans", &graph::clear_plans,
        "Destroy every cached graph-engine execution plan (and the descriptors it holds).");
  m.def("_graph_build_operations", &build_operations, py::arg("direction"), py::arg("precision"), py::arg("layout"),
        py::arg("x"), py::arg("w"), py::arg("y") = py::none(), py::arg("pad") = Pair{0, 0},
        py::arg("stride") = Pair{1, 1}, py::arg("dilation") = Pair{1, 1}, py::arg("groups") = 1,
        py::arg("epilogue") = "none", py::arg("alpha1") = 1.0f, py::arg("alpha2") = 1.0f, py::arg("beta") = 0.0f,
        py::arg("validate") = true, py::arg("fail_after_parts") = -1,
        "Build (then destroy) the tensors, convolution descriptor and operations of a graph-engine problem; "
        "shapes are logical NCHW. Returns what was built. Works without a GPU.");
  m.def(
      "_graph_describe_problem",
      [](const std::string& direction, const std::string& precision, const std::string& layout, const Quad& x,
         const Quad& w, const Pair& pad, const Pair& stride, const Pair& dilation, int groups,
         const std::string& epilogue, bool deterministic) {
        return graph::describe_problem(make_params(direction, precision, layout, x, w, py::none(), pad, stride,
                                                   dilation, groups, epilogue, deterministic));
      },
      py::arg("direction"), py::arg("precision"), py::arg("layout"), py::arg("x"), py::arg("w"),
      py::arg("pad") = Pair{0, 0}, py::arg("stride") = Pair{1, 1}, py::arg("dilation") = Pair{1, 1},
      py::arg("groups") = 1, py::arg("epilogue") = "none", py::arg("deterministic") = false);
  m.def("_graph_parse_knobs", &graph::parse_knobs, py::arg("text"));
  m.def("_graph_format_knobs", &graph::format_knobs, py::arg("knobs"));
  m.def(
      "_graph_forbidden_notes",
      [](const std::string& precision, bool deterministic, const std::vector<int>& notes) {
        ConvParams p;
        p.precision = static_cast<uint8_t>(parse_precision(precision));
        p.deterministic = deterministic ? 1 : 0;
        uint32_t bits = 0;
        for (int n : notes) {
          if (n < 0 || n >= 32) throw ValueError("notes: numerical note out of range: " + std::to_string(n));
          bits |= 1u << n;
        }
        return graph::forbidden_notes(p, bits);
      },
      py::arg("precision"), py::arg("deterministic"), py::arg("notes"),
      "Why an engine with these numerical notes (cudnnBackendNumericalNote_t values) is excluded; '' if not.");
}

}  // namespace rn
