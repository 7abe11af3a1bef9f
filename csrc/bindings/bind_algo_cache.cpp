// Python bindings of the process-wide algorithm cache (resnet_native.conv's cache functions and file I/O sit on
// them), the drop of cached descriptors and plans, and test hooks of the ConvParams key and of legacy descriptor
// groups.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "../conv/algo_cache.h"
#include "../conv/conv_dispatch.h"
#include "../conv/conv_geometry.h"
#include "../conv/conv_params.h"
#include "../conv/legacy_algo_names.h"
#include "../conv/legacy_descriptors.h"
#include "../core/error.h"
#include "bindings.h"

namespace py = pybind11;

namespace rn {
namespace {

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
  d["search_ms"] = c.search_ms;
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
  d["capacity"] = s.capacity;
  d["evictions"] = s.evictions;
  return d;
}

}  // namespace

void bind_algo_cache(py::module_& m) {
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
      "hits, misses, finds (timed searches run), entries, capacity and evictions.");
  m.def(
      "algo_cache_set_capacity",
      [](int64_t capacity) {
        if (capacity < 1) throw ValueError("capacity: must be at least 1 entry, got " + std::to_string(capacity));
        AlgoCache::global().set_capacity(static_cast<size_t>(capacity));
      },
      py::arg("capacity"), "Keep at most this many entries (the least recently used are evicted, at once too).");
  m.def("algo_cache_capacity", [] { return AlgoCache::global().capacity(); });
  m.def(
      "_algo_cache_touch",
      [](const std::string& key) { return AlgoCache::global().lookup(ConvParams::from_string(key)) != nullptr; },
      py::arg("key"),
      "Test hook: look a key up as a convolution does (counts a hit or a miss; a hit becomes the most recently "
      "used entry). Returns whether it was cached.");

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
      "_conv_key_check", [](const std::string& key) { check_key_geometry(ConvParams::from_string(key)); },
      py::arg("key"), "ValueError unless the key parses and describes a convolution (conv_geometry.h).");
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
