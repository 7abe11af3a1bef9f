// Python bindings of the graph engine's plan cache: count, clear, capacity, stats (its test hooks are in
// testing/bind_testing_conv.cpp). Convolutions themselves are called through the shared conv bindings
// (bind_conv.cpp), which dispatch to rn::graph::choose / run for engine='graph'.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "../conv/graph/graph_engine.h"
#include "../conv/graph/plan_cache.h"
#include "../core/error.h"
#include "bindings.h"

namespace py = pybind11;

namespace rn {
namespace {

py::dict plan_cache_stats() {
  const graph::PlanCacheStats s = graph::plan_cache_stats();
  py::dict d;
  d["plans"] = s.plans;
  d["capacity"] = s.capacity;
  d["evictions"] = s.evictions;
  d["pinned"] = s.pinned;
  return d;
}

}  // namespace

void bind_graph_engine(py::module_& m) {
  m.def("graph_num_plans", &graph::num_plans, "Number of execution plans the graph engine holds.");
  m.def("graph_clear_plans", &graph::clear_plans,
        "Destroy every cached graph-engine execution plan (and the descriptors it holds), pinned ones included.");
  m.def(
      "graph_set_plan_cache_capacity",
      [](int64_t capacity) {
        if (capacity < 1) throw ValueError("capacity: must be at least 1 plan, got " + std::to_string(capacity));
        graph::set_plan_cache_capacity(static_cast<size_t>(capacity));
      },
      py::arg("capacity"),
      "Keep at most this many execution plans besides pinned ones (the least recently used are evicted, at once "
      "too).");
  m.def("graph_plan_cache_stats", &plan_cache_stats,
        "plans, capacity, evictions and pinned (plans executed during a CUDA-graph capture: never evicted).");
}

}  // namespace rn
