// Python bindings of the process-wide algorithm cache (resnet_native.ops.algo_cache and file I/O sit on
// them: keys and entries are parsed and checked here, cache_entry.h) and the drop of cached descriptors and plans.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "../conv/algo_cache.h"
#include "../conv/conv_dispatch.h"
#include "../conv/conv_geometry.h"
#include "../conv/conv_params.h"
#include "../conv/legacy_algo_names.h"
#include "../core/error.h"
#include "bindings.h"
#include "cache_entry.h"

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

// Every entry of a cache file checked before any is inserted: a damaged file adds nothing.
size_t insert_entries(py::handle entries, int device) {
  if (!PyList_Check(entries.ptr())) throw ValueError("entries: expected a list of entries");
  std::vector<std::pair<ConvParams, AlgoChoice>> checked;
  const py::list list = py::reinterpret_borrow<py::list>(entries);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "entry " + std::to_string(i);
    py::handle e = list[i];
    if (!PyDict_Check(e.ptr()) || !py::reinterpret_borrow<py::dict>(e).contains("key") ||
        !PyUnicode_Check(py::reinterpret_borrow<py::dict>(e)["key"].ptr())) {
      throw ValueError(where + " is not an object with a 'key'");
    }
    ConvParams params;
    try {
      params = checked_key(py::reinterpret_borrow<py::dict>(e)["key"].cast<std::string>(), false);
    } catch (const ValueError& err) {
      throw ValueError(where + ": 'key': " + err.what());
    }
    try {
      checked.emplace_back(params, checked_choice(params, e));
    } catch (const ValueError& err) {
      throw ValueError(where + ": " + err.what());
    }
    if (device >= 0) checked.back().first.device = device;
  }
  for (const auto& [params, choice] : checked) AlgoCache::global().insert(params, choice);
  return checked.size();
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
      [](const std::string& key, py::handle choice, int device) {
        ConvParams params;
        try {
          params = checked_key(key, false);
        } catch (const ValueError& e) {
          throw ValueError(std::string("'key': ") + e.what());
        }
        const AlgoChoice checked = checked_choice(params, choice);
        if (device >= 0) params.device = device;
        AlgoCache::global().insert(params, checked);
      },
      py::arg("key"), py::arg("choice"), py::arg("device") = -1,
      "Insert or replace an entry (device >= 0 re-keys it to that device), after checking the key and every field "
      "of the choice (ValueError naming the field).");
  m.def("algo_cache_insert_entries", &insert_entries, py::arg("entries"), py::arg("device") = -1,
        "Insert a cache file's entries (dicts with a 'key' and the choice's fields), every one checked first: "
        "ValueError 'entry <i>: <what is wrong>' and nothing inserted. Returns how many were inserted.");
  m.def(
      "parse_conv_key", [](const std::string& key) { return key_fields(checked_key(key, true)); }, py::arg("key"),
      "The fields of an algorithm-cache key, typed ({'dir': 'fwd', 'direction': 'forward', 'x': (8, 64, 32, 32), "
      "'ws': None, ...}), after the checks every key gets; ValueError naming the key and the field otherwise.");
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

  m.def("drop_cached_descriptors", &drop_cached_descriptors,
        "Destroy every cached cuDNN descriptor and execution plan (both engines); they are rebuilt on demand.");
}

}  // namespace rn
