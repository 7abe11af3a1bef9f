// Test hooks of the convolution key (ConvParams), the algorithm cache, legacy descriptor groups and the graph
// engine. They take a problem as its algorithm-cache key (resnet_native._C.conv_key builds one through the ops' own
// validation; an edited key reaches the engines' own checks with shapes no op would accept).
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "../conv/algo_cache.h"
#include "../conv/conv_params.h"
#include "../conv/graph/conv_op_graph.h"
#include "../conv/graph/engine_config.h"
#include "../conv/graph/engine_search.h"
#include "../conv/graph/graph_engine.h"
#include "../conv/graph/plan_cache.h"
#include "../conv/legacy_descriptors.h"
#include "../core/error.h"
#include "bind_testing.h"

namespace py = pybind11;

namespace rn {
namespace {

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
py::dict build_operations(const std::string& key, float alpha1, float alpha2, float beta, bool validate,
                          int fail_after_parts) {
  const ConvParams p = ConvParams::from_string(key);
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

std::string forbidden_notes(Precision precision, bool deterministic, const std::vector<int>& notes) {
  uint32_t bits = 0;
  for (int n : notes) {
    if (n < 0 || n >= 32) throw ValueError("notes: numerical note out of range: " + std::to_string(n));
    bits |= 1u << n;
  }
  return graph::forbidden_notes(precision, deterministic, bits);
}

// Placeholder plans: keyed like real ones (the problem of an algorithm-cache key, default graph constants), but
// empty, so the cache's policy can be tested without a GPU. Test keys use negative engine ids, which no cuDNN engine
// has, so no run() ever finds (and executes) a placeholder.
graph::PlanKey placeholder_key(const std::string& key, int64_t engine_id, const std::string& knobs) {
  if (engine_id >= 0)
    throw ValueError("engine_id: placeholder plans take negative engine ids, got " + std::to_string(engine_id));
  return graph::PlanKey{ConvParams::from_string(key), graph::GraphConstants{}, engine_id, knobs};
}

graph::PlanKeyRef ref(const graph::PlanKey& k) {
  return graph::PlanKeyRef{k.params, k.constants, k.engine_id, k.knobs};
}

void build_legacy_descriptors(const std::string& key, bool cached) {
  const ConvParams params = ConvParams::from_string(key);
  const cudnnMathType_t math = cudnn_math_type(static_cast<Precision>(params.precision));
  if (cached) {
    legacy::descriptors(params, math);
  } else {
    legacy::ConvDescriptors group(params, math);
  }
}

}  // namespace

void bind_testing_conv(py::module_& t) {
  t.def(
      "algo_cache_touch",
      [](const std::string& key) { return AlgoCache::global().lookup(ConvParams::from_string(key)) != nullptr; },
      py::arg("key"),
      "Look a key up as a convolution does (counts a hit or a miss; a hit becomes the most recently used entry). "
      "Returns whether it was cached.");
  t.def("legacy_descriptor_cache_size", &legacy::descriptor_cache_size);
  t.def("build_legacy_descriptors", &build_legacy_descriptors, py::arg("key"), py::arg("cached") = false,
        "Build the legacy descriptor group of a key (a failure half-way must leak nothing).");
  t.def(
      "conv_params_roundtrip", [](const std::string& key) { return ConvParams::from_string(key).to_string(); },
      py::arg("key"));
  t.def(
      "conv_params_equal",
      [](const std::string& a, const std::string& b) {
        return ConvParams::from_string(a) == ConvParams::from_string(b);
      },
      py::arg("a"), py::arg("b"));
  t.def(
      "conv_params_hash", [](const std::string& key) { return ConvParamsHash()(ConvParams::from_string(key)); },
      py::arg("key"));

  t.def(
      "graph_plan_cache_add_placeholder",
      [](const std::string& key, int64_t engine_id, const std::string& knobs, bool pin) {
        const graph::PlanKey k = placeholder_key(key, engine_id, knobs);
        auto placeholder = std::make_shared<graph::ExecutionPlan>();
        placeholder->engine_id = engine_id;
        placeholder->knobs = knobs;
        return graph::PlanCache::instance().insert(ref(k), placeholder, pin) == placeholder;
      },
      py::arg("key"), py::arg("engine_id"), py::arg("knobs") = "", py::arg("pin") = false,
      "Cache an empty plan (never executed) as run() caches a new one, pinned as during a capture if `pin`. "
      "Returns whether it is now the cached plan (False: a plan of that key was kept).");
  t.def(
      "graph_plan_cache_find",
      [](const std::string& key, int64_t engine_id, const std::string& knobs, bool pin) {
        const graph::PlanKey k = placeholder_key(key, engine_id, knobs);
        return graph::PlanCache::instance().find(ref(k), pin) != nullptr;
      },
      py::arg("key"), py::arg("engine_id"), py::arg("knobs") = "", py::arg("pin") = false,
      "Look a placeholder's key up as run() does (a hit becomes the most recently used plan, pinned if `pin`). "
      "Returns whether it was cached.");
  t.def("graph_build_operations", &build_operations, py::arg("key"), py::arg("alpha1") = 1.0f, py::arg("alpha2") = 1.0f,
        py::arg("beta") = 0.0f, py::arg("validate") = true, py::arg("fail_after_parts") = -1,
        "Build (then destroy) the tensors, convolution descriptor and operations of the graph-engine problem of an "
        "algorithm-cache key. Returns what was built. Works without a GPU.");
  t.def(
      "graph_describe_problem",
      [](const std::string& key) { return graph::describe_problem(ConvParams::from_string(key)); }, py::arg("key"),
      "How graph-engine errors name the problem of an algorithm-cache key.");
  t.def("graph_parse_knobs", &graph::parse_knobs, py::arg("text"));
  t.def("graph_format_knobs", &graph::format_knobs, py::arg("knobs"));
  t.def("graph_forbidden_notes", &forbidden_notes, py::arg("precision"), py::arg("deterministic"), py::arg("notes"),
        "Why an engine with these numerical notes (cudnnBackendNumericalNote_t values) is excluded; '' if not.");
}

}  // namespace rn
