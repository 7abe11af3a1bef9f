#include "cache_entry.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "../conv/conv_geometry.h"
#include "../conv/legacy_algo_names.h"
#include "../core/error.h"
#include "array_sources.h"

namespace py = pybind11;

namespace rn {
namespace {

// cudnnMathType_t: DEFAULT_MATH .. FMA_MATH. The graph engine stores no math type (0).
constexpr int64_t kMathTypes = 4;
// The graph engine stores a cuDNN engine's global index; cuDNN 9 has well under a hundred per operation graph.
constexpr int64_t kGraphEngineIds = int64_t{1} << 16;
// No GPU has a terabyte of memory: a workspace claim beyond that is a damaged file, not a choice.
constexpr uint64_t kMaxWorkspace = uint64_t{1} << 40;

std::string quoted(const char* field) {
  return std::string("'") + field + "'";
}

// A field the choice must have, of exactly this kind (a bool is no int): ValueError "lacks a valid 'algo'".
py::object field(const py::dict& d, const char* name) {
  if (!d.contains(name)) throw ValueError("lacks a valid " + quoted(name));
  return d[name];
}

std::string str_field(const py::dict& d, const char* name) {
  py::object v = field(d, name);
  if (!PyUnicode_Check(v.ptr())) throw ValueError("lacks a valid " + quoted(name));
  return v.cast<std::string>();
}

// An int field; `*overflow` when it does not fit int64 (then out of every range).
int64_t int_field(const py::dict& d, const char* name, bool* overflow) {
  py::object v = field(d, name);
  int64_t value = 0;
  if (!PyLong_Check(v.ptr()) || !read_int64(v, &value, overflow)) throw ValueError("lacks a valid " + quoted(name));
  return value;
}

std::string optional_str(const py::dict& d, const char* name) {
  if (!d.contains(name)) return "";
  py::object v = d[name];
  if (!PyUnicode_Check(v.ptr())) throw ValueError(quoted(name) + " is not a string");
  return v.cast<std::string>();
}

std::string repr(const py::dict& d, const char* name) {
  return py::repr(d[name]);
}

py::tuple ints(const int32_t* v, int n) {
  py::tuple t(n);
  for (int i = 0; i < n; ++i) t[i] = v[i];
  return t;
}

}  // namespace

ConvParams checked_key(const std::string& key, bool name_key) {
  const ConvParams params = ConvParams::from_string(key);  // its messages quote the key
  try {
    check_key_geometry(params);
  } catch (const ValueError& e) {
    if (!name_key) throw;
    throw ValueError("convolution key '" + key + "': " + e.what());
  }
  return params;
}

py::dict key_fields(const ConvParams& p) {
  const auto direction = static_cast<ConvDirection>(p.direction);
  py::dict d;
  d["dir"] = direction_key(direction);
  d["direction"] = kDirectionNames[p.direction].name;
  d["dev"] = p.device;
  d["prec"] = precision_name(static_cast<Precision>(p.precision));
  d["layout"] = layout_name(static_cast<Layout>(p.layout));
  d["engine"] = engine_name(static_cast<ConvEngineKind>(p.engine));
  d["epi"] = epilogue_name(p.epilogue);
  d["det"] = p.deterministic != 0;
  d["mode"] = algo_mode_name(static_cast<AlgoMode>(p.algo_mode));
  d["fixed"] = p.fixed_algo;
  d["x"] = ints(p.x, 4);
  d["w"] = ints(p.w, 4);
  d["y"] = ints(p.y, 4);
  d["pad"] = ints(p.pad, 2);
  d["stride"] = ints(p.stride, 2);
  d["dil"] = ints(p.dilation, 2);
  d["groups"] = p.groups;
  d["ws"] = p.workspace_cap == UINT64_MAX ? py::object(py::none()) : py::object(py::int_(p.workspace_cap));
  d["out"] = p.out_dtype == 0 ? py::object(py::none()) : py::object(py::str(dtype_short_name(p.y_dtype())));
  return d;
}

AlgoChoice checked_choice(const ConvParams& params, py::handle obj) {
  if (!PyDict_Check(obj.ptr())) throw ValueError("is not an object (a dict)");
  const py::dict d = py::reinterpret_borrow<py::dict>(obj);
  bool algo_big = false, math_big = false, workspace_big = false;
  const std::string engine = str_field(d, "engine");
  const std::string mode = str_field(d, "mode");
  const int64_t algo = int_field(d, "algo", &algo_big);
  const int64_t math_type = int_field(d, "math_type", &math_big);
  const int64_t workspace = int_field(d, "workspace", &workspace_big);
  AlgoChoice c;
  if (engine != "legacy" && engine != "graph") {
    throw ValueError("'engine' " + repr(d, "engine") + " is not 'legacy' or 'graph'");
  }
  c.engine = static_cast<uint8_t>(parse_engine(engine));
  bool known_mode = false;
  std::string modes;
  for (const auto& m : kAlgoModeNames) {
    known_mode = known_mode || mode == m.name;
    modes += (modes.empty() ? "" : ", ") + std::string(m.name);
  }
  if (!known_mode) throw ValueError("'mode' " + repr(d, "mode") + " is not one of " + modes);
  c.mode = static_cast<uint8_t>(parse_algo_mode(mode));
  c.knobs = optional_str(d, "knobs");
  c.fused_path = optional_str(d, "fused_path");
  optional_str(d, "algo_name");  // written for readers; the choice is the algo
  if (d.contains("time_ms") && !d["time_ms"].is_none()) {
    py::object t = d["time_ms"];
    const bool number = (PyLong_Check(t.ptr()) || PyFloat_Check(t.ptr())) && !PyBool_Check(t.ptr());
    const double ms = number ? PyFloat_AsDouble(t.ptr()) : -1.0;
    if (PyErr_Occurred()) PyErr_Clear();
    // Stored as a float: a finite double past its range would become inf and be written back as one.
    if (!number || !(ms >= 0.0) || !(ms <= static_cast<double>(std::numeric_limits<float>::max()))) {
      throw ValueError("'time_ms' " + repr(d, "time_ms") + " is not a duration");
    }
    c.time_ms = static_cast<float>(ms);
  }
  const auto direction = static_cast<ConvDirection>(params.direction);
  if (c.engine == static_cast<uint8_t>(ConvEngineKind::Legacy)) {
    const int64_t n = static_cast<int64_t>(legacy::algo_names(direction).size());
    if (algo_big || algo < 0 || algo >= n) {
      throw ValueError("'algo' " + repr(d, "algo") + " is not a " + kDirectionNames[params.direction].name +
                       " algorithm (0 to " + std::to_string(n - 1) + ")");
    }
    if (math_big || math_type < 0 || math_type >= kMathTypes) {
      throw ValueError("'math_type' " + repr(d, "math_type") + " is not a cuDNN math type (0 to " +
                       std::to_string(kMathTypes - 1) + ")");
    }
  } else {
    if (algo_big || algo < 0 || algo >= kGraphEngineIds) {
      throw ValueError("'algo' " + repr(d, "algo") + " is not a graph engine id (0 to " +
                       std::to_string(kGraphEngineIds - 1) + ")");
    }
    if (math_big || math_type != 0) {
      throw ValueError("'math_type' " + repr(d, "math_type") + " (the graph engine stores 0)");
    }
  }
  const bool capped = params.workspace_cap < kMaxWorkspace;
  const uint64_t cap = capped ? params.workspace_cap : kMaxWorkspace;
  if (workspace_big || workspace < 0 || static_cast<uint64_t>(workspace) > cap) {
    throw ValueError("'workspace' " + repr(d, "workspace") + " is outside 0 to " + std::to_string(cap) + " bytes" +
                     (capped ? " (the key's workspace cap)" : ""));
  }
  c.algo = static_cast<int32_t>(algo);
  c.math_type = static_cast<int32_t>(math_type);
  c.workspace = static_cast<uint64_t>(workspace);
  return c;
}

}  // namespace rn
