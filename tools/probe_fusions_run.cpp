// The probe's runner: the graph's memory, the plans of a graph (heuristics modes and, with FUSIONS_ENUM=all, every
// engine of cuDNN's global list that takes the graph), a check of every plan's outputs, timing, and the JSON lines.
#include "probe_fusions.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

namespace probe {
namespace {

using Clock = std::chrono::steady_clock;
const Clock::time_point process_start = Clock::now();
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

size_t type_bytes(DataType t) {
  return t == DataType::FLOAT ? 4 : (t == DataType::HALF || t == DataType::BFLOAT16) ? 2 : 0;
}
int param_block(DataType t) {
  return t == DataType::HALF ? 0 : t == DataType::BFLOAT16 ? 1 : 2;
}
const char* type_name(DataType t) {
  return t == DataType::FLOAT ? "FLOAT" : t == DataType::HALF ? "HALF" : t == DataType::BFLOAT16 ? "BF16" : "OTHER";
}

int64_t volume(const TensorPtr& t) {
  int64_t v = 1;
  for (auto d : t->get_dim()) v *= d;
  return v;
}

// cudnn-frontend's KnobType_t values 0..32 (knobs.h), for readable knob lists.
const char* knob_name(fe::KnobType_t k) {
  static const char* names[] = {"NOT_SET",
                                "SWIZZLE",
                                "TILE_SIZE",
                                "EDGE",
                                "MULTIPLY",
                                "SPLIT_K_BUF",
                                "TILEK",
                                "STAGES",
                                "REDUCTION_MODE",
                                "SPLIT_K_SLC",
                                "IDX_MODE",
                                "SPECFILT",
                                "KERNEL_CFG",
                                "WORKSPACE",
                                "TILE_CGA_M",
                                "TILE_CGA_N",
                                "BLOCK_SIZE",
                                "OCCUPANCY",
                                "ARRAY_SIZE_PER_THREAD",
                                "SPLIT_COLS",
                                "TILE_ROWS",
                                "TILE_COLS",
                                "LOAD_SIZE",
                                "CTA_COUNT",
                                "STREAM_K",
                                "SPLIT_P_SLC",
                                "TILE_M",
                                "TILE_N",
                                "WARP_SPEC_CFG",
                                "SWAP_AB",
                                "INPUT_TMA_ENABLE",
                                "OUTPUT_TMA_ENABLE",
                                "TILE_CGA"};
  const auto i = static_cast<int64_t>(k);
  return i >= 0 && i < int64_t(sizeof(names) / sizeof(names[0])) ? names[i] : "FRONTEND_KNOB";
}

void check(fe::error_object s, const char* step) {
  if (s.is_bad()) throw std::runtime_error(std::string(step) + ": " + s.get_message());
}

struct Plan {
  int64_t index = -1;
  std::string source, tag, notes, knobs, error;
  int64_t engine = -1, workspace = -1;
  bool rtc = false, built = false;
  double ms = -1;
};

// Memory of one graph: the variant pack and the outputs, with their sizes and types for the poison and the check.
struct Memory {
  std::unordered_map<int64_t, void*> pack;  // by tensor uid, the frontend's own key
  struct Out {
    std::string name;
    void* ptr;
    int64_t elements;
    DataType type;
  };
  std::vector<Out> outputs;
};

Memory assign(Device& d, Probe& pr) {
  Memory m;
  size_t in = 0, out = 0;
  for (auto& [t, role] : pr.tensors) {
    const size_t bytes = type_bytes(t->get_data_type());
    if (bytes == 0) throw std::runtime_error("tensor " + t->get_name() + " has an unexpected data type");
    const size_t size = (size_t(volume(t)) * bytes + 255) / 256 * 256;
    if (role == Role::Param) {
      m.pack[t->get_uid()] = d.params[param_block(t->get_data_type())];
    } else if (role == Role::Input) {
      if (in + size > d.input_bytes) throw std::runtime_error("input arena too small");
      m.pack[t->get_uid()] = d.inputs + in;
      in += size;
    } else {
      if (out + size > d.output_bytes) throw std::runtime_error("output arena too small");
      m.pack[t->get_uid()] = d.outputs + out;
      m.outputs.push_back({t->get_name(), d.outputs + out, volume(t), t->get_data_type()});
      out += size;
    }
  }
  return m;
}

// Every output byte 0xFF (a NaN in fp16, bf16 and fp32) before a plan's first run; after it, a sample of each output
// (all of a small one, 4096 evenly spaced values and the last of a large one) must be finite: a plan that runs but
// leaves an output unwritten, or writes NaN, is flagged and not timed.
void poison(Device& d, const Memory& m) {
  for (const auto& o : m.outputs) {
    CHECK_CUDA(cudaMemsetAsync(o.ptr, 0xFF, size_t(o.elements) * type_bytes(o.type), d.stream));
  }
}

std::string check_outputs(const Memory& m) {
  std::string bad;
  for (const auto& o : m.outputs) {
    const size_t eb = type_bytes(o.type);
    const int64_t samples = std::min<int64_t>(o.elements, 4096);
    std::vector<unsigned char> host((samples + 1) * eb);
    const size_t step = size_t(o.elements / samples) * eb;
    CHECK_CUDA(cudaMemcpy2D(host.data(), eb, o.ptr, step, eb, samples, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(host.data() + samples * eb, static_cast<char*>(o.ptr) + (o.elements - 1) * eb, eb,
                          cudaMemcpyDeviceToHost));
    int64_t nonfinite = 0;
    for (int64_t i = 0; i <= samples; ++i) {
      uint32_t v = 0;
      std::memcpy(&v, host.data() + i * eb, eb);
      const uint32_t mask = o.type == DataType::FLOAT ? 0x7F800000u : o.type == DataType::HALF ? 0x7C00u : 0x7F80u;
      nonfinite += (v & mask) == mask;
    }
    if (nonfinite)
      bad += o.name + ": " + std::to_string(nonfinite) + " of " + std::to_string(samples + 1) + " not finite; ";
  }
  return bad;
}

// The median over `repeats` trials of the mean of `batch` back-to-back runs (a batch keeps the host's launch cost,
// some microseconds, out of the GPU time of 30-200 us kernels).
double time_plan(Device& d, Probe& pr, Memory& m, int64_t index, const Options& o, std::string& err) {
  std::vector<float> ms;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    CHECK_CUDA(cudaEventRecord(d.start, d.stream));
    for (int b = 0; b < o.batch; ++b) {
      auto s = pr.graph.execute_plan_at_index(d.handle, m.pack, d.workspace, index);
      if (s.is_bad()) {
        err = s.get_message();
        CHECK_CUDA(cudaStreamSynchronize(d.stream));
        return -1;
      }
    }
    CHECK_CUDA(cudaEventRecord(d.stop, d.stream));
    CHECK_CUDA(cudaEventSynchronize(d.stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, d.start, d.stop));
    if (i >= o.warmup) ms.push_back(t / o.batch);
  }
  CHECK_CUDA(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The plans at indices [from, count) of the graph's list, with what cuDNN says of each before it is built.
void collect(Probe& pr, int64_t from, const std::string& source, std::vector<Plan>& plans) {
  for (int64_t i = from; i < pr.graph.get_execution_plan_count(); ++i) {
    Plan p;
    p.index = i;
    p.source = source;
    if (pr.graph.get_plan_name_at_index(i, p.tag).is_bad()) p.tag = "?";
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    if (pr.graph.get_engine_and_knobs_at_index(i, p.engine, knobs).is_good()) {
      std::map<int64_t, std::string> sorted;
      for (auto& [k, v] : knobs) sorted[static_cast<int64_t>(k)] = std::string(knob_name(k)) + "=" + std::to_string(v);
      for (auto& [k, s] : sorted) p.knobs += (p.knobs.empty() ? "" : " ") + s;
    }
    std::vector<fe::BehaviorNote_t> notes;
    if (pr.graph.get_behavior_notes_for_plan_at_index(i, notes).is_bad()) {
      p.notes = "?";  // unknown: counted as precompiled, but the note says so
    } else {
      for (auto n : notes) {
        const bool rtc = n == fe::BehaviorNote_t::RUNTIME_COMPILATION;
        p.rtc = p.rtc || rtc;
        p.notes += std::string(p.notes.empty() ? "" : " ") +
                   (rtc                                                       ? "RUNTIME_COMPILATION"
                    : n == fe::BehaviorNote_t::SUPPORTS_CUDA_GRAPH_NATIVE_API ? "CUDA_GRAPH_NATIVE"
                    : n == fe::BehaviorNote_t::CUBLASLT_DEPENDENCY            ? "CUBLASLT"
                                                                              : "OTHER");
      }
    }
    plans.push_back(p);
  }
}

// The graph's candidate plans, deduplicated by tag, in the order they are built: heuristics mode A's ranking, then
// (enumeration) the precompiled plans of mode B, FALLBACK and the global engine list, then their runtime-compiled
// ones. `engines` gets the JSON list of every engine that takes the graph, with its knobs' ranges; `sweep` adds
// knob variations of the precompiled engines found only in that list.
std::vector<Plan> candidates(const Options& o, bool sweep, Probe& pr, std::string& engines, int64_t& global,
                             std::string& err) {
  std::vector<Plan> all;
  if (!o.enumerate) {
    check(pr.graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans");
    collect(pr, 0, "A+FALLBACK", all);
    return all;
  }
  const std::pair<fe::HeurMode_t, const char*> modes[] = {
      {fe::HeurMode_t::A, "A"}, {fe::HeurMode_t::B, "B"}, {fe::HeurMode_t::FALLBACK, "FALLBACK"}};
  for (auto [mode, name] : modes) {
    const int64_t from = pr.graph.get_execution_plan_count();
    auto s = pr.graph.create_execution_plans({mode});
    if (s.is_bad()) err += std::string(name) + ": " + s.get_message() + "; ";
    collect(pr, from, name, all);
  }
  check(pr.graph.get_engine_count(global), "get_engine_count");
  std::set<int64_t> listed;
  for (const auto& p : all) listed.insert(p.engine);
  std::map<int64_t, std::string> knob_ranges;
  for (int64_t e = 0; e < global; ++e) {
    std::vector<fe::Knob> knobs;
    if (pr.graph.get_knobs_for_engine(e, knobs).is_bad()) continue;  // the engine does not take this graph
    std::string ranges;
    for (const auto& k : knobs) {
      ranges += (ranges.empty() ? "" : " ") + std::string(knob_name(k.type)) + "=" + std::to_string(k.minValue) + ".." +
                std::to_string(k.maxValue) + (k.stride > 1 ? "/" + std::to_string(k.stride) : "");
    }
    knob_ranges[e] = ranges;
    if (listed.count(e)) continue;
    const int64_t from = pr.graph.get_execution_plan_count();
    auto s = pr.graph.create_execution_plan(e, {});  // the engine's default knobs
    if (s.is_bad()) {
      Plan p;
      p.engine = e;
      p.source = "engine";
      p.error = "create_execution_plan: " + s.get_message();
      all.push_back(p);
      continue;
    }
    collect(pr, from, "engine", all);
    // A precompiled engine no heuristics mode ranked, on a fused graph: its knobs one at a time over their ranges
    // (the others at their defaults), at most 16 configurations; combinations the engine refuses fail to build.
    if (!sweep || all.back().index < 0 || all.back().rtc) continue;
    int configs = 0;
    for (const auto& k : knobs) {
      for (int64_t v = k.minValue; v <= k.maxValue && configs < 16; v += std::max<int64_t>(k.stride, 1), ++configs) {
        const int64_t at = pr.graph.get_execution_plan_count();
        if (pr.graph.create_execution_plan(e, {{k.type, v}}).is_good()) collect(pr, at, "knob sweep", all);
      }
    }
  }
  std::map<int64_t, bool> engine_rtc;
  for (const auto& p : all) {
    if (p.index >= 0) engine_rtc[p.engine] = p.rtc;
  }
  for (const auto& [e, ranges] : knob_ranges) {
    const auto r = engine_rtc.find(e);
    engines += std::string(engines.empty() ? "" : ", ") + "{\"id\": " + std::to_string(e) + ", \"rtc\": " +
               (r == engine_rtc.end() ? "null"
                : r->second           ? "true"
                                      : "false") +
               ", \"knobs\": \"" + json_escape(ranges) + "\"}";
  }
  // Deduplicate (modes overlap), then A's order first, precompiled before runtime-compiled for the rest.
  std::vector<Plan> out;
  std::map<std::string, size_t> seen;
  for (auto& p : all) {
    auto it = p.index >= 0 ? seen.find(p.tag) : seen.end();
    if (it != seen.end()) {
      out[it->second].source += "," + p.source;
      continue;
    }
    if (p.index >= 0) seen[p.tag] = out.size();
    out.push_back(p);
  }
  std::stable_sort(out.begin(), out.end(), [](const Plan& a, const Plan& b) {
    auto rank = [](const Plan& p) { return p.source.rfind("A", 0) == 0 ? 0 : p.rtc ? 2 : 1; };
    return rank(a) < rank(b);
  });
  return out;
}

struct Summary {
  bool ok = false;
  double ms = -1, pre_ms = -1, rtc_ms = -1;
  std::string tag, pre_tag, rtc_tag, error, engines, pre_engines, heur_errors, types;
  int64_t plans = 0, global = 0;
  int built = 0, bad = 0, supported = 0;
  bool lite = false;
};

std::unordered_map<std::string, std::pair<std::string, Summary>> done;  // dx_apply by input shape: layer, result

}  // namespace

void run_graph(Device& d, const Options& o, const std::string& model, const Layer& l, const std::string& dtype,
               const std::string& pattern) {
  const auto t0 = Clock::now();
  std::ostringstream shape;
  shape << l.n << "x" << l.c << "x" << l.h << "x" << l.w << " k" << l.k << " r" << l.r << " s" << l.stride;
  const std::string head = "\"model\": \"" + model + "\", \"layer\": \"" + l.name + "\", \"dtype\": \"" + dtype +
                           "\", \"pattern\": \"" + pattern + "\"";
  // dBNApply depends on the convolution's input only: one graph per input shape, its result repeated.
  const std::string key = pattern == "dx_apply" ? pattern + std::to_string(l.c) + "x" + std::to_string(l.h) : "";
  Summary r;
  std::string same_as;
  if (!key.empty() && done.count(key)) {
    same_as = done[key].first;
    r = done[key].second;
  } else if (since(process_start) > o.deadline_s) {
    r.error = "skipped: past the deadline";
  } else {
    r.lite = since(process_start) > 0.75 * o.deadline_s;
    const int max_plans = r.lite ? std::min(o.max_plans, 4) : o.max_plans;
    const int max_rtc = r.lite ? std::min(o.max_rtc, 1) : o.max_rtc;
    Probe pr;
    const DataType io = dtype == "bf16" ? DataType::BFLOAT16 : DataType::HALF;
    std::vector<Plan> plans;
    try {
      if (!build_first_patterns(pr, pattern, l, io) && !build_specialized(pr, pattern, l, io)) {
        throw std::runtime_error("unknown pattern " + pattern);
      }
      check(pr.graph.validate(), "validate");
      for (auto& [t, role] : pr.tensors) {
        r.types += (r.types.empty() ? "" : " ") + t->get_name() + ":" + type_name(t->get_data_type());
      }
      if (o.dry) {
        r.error = "dry run: the graph validated";
      } else {
        check(pr.graph.build_operation_graph(d.handle), "build_operation_graph");
        const bool fused = pattern != "fprop" && pattern != "dgrad" && pattern != "wgrad";
        plans = candidates(o, fused, pr, r.engines, r.global, r.heur_errors);
        r.plans = pr.graph.get_execution_plan_count();
        Memory m = assign(d, pr);
        int rtc_built = 0;
        const auto t_plans = Clock::now();  // the graph's time cap counts from here, past the enumeration
        std::set<int64_t> precompiled;      // engines without the runtime-compilation note that take the graph
        for (auto& p : plans) {
          if (p.index < 0) continue;
          if (!p.rtc) precompiled.insert(p.engine);
          if (r.built >= max_plans || (p.rtc && rtc_built >= max_rtc) || since(t_plans) > o.graph_s) {
            p.error = "not built: per-graph cap";
            continue;
          }
          rtc_built += p.rtc;
          auto s = pr.graph.build_plan_at_index(p.index);
          if (s.is_bad()) {
            p.error = "build: " + s.get_message();
            continue;
          }
          p.built = true;
          if (pr.graph.get_workspace_size_plan_at_index(p.index, p.workspace).is_bad() ||
              size_t(p.workspace) > d.workspace_bytes) {
            p.error = "workspace " + std::to_string(p.workspace) + " not available";
            continue;
          }
          ++r.built;
          poison(d, m);
          auto first = pr.graph.execute_plan_at_index(d.handle, m.pack, d.workspace, p.index);
          CHECK_CUDA(cudaStreamSynchronize(d.stream));
          CHECK_CUDA(cudaGetLastError());
          if (first.is_bad()) {
            p.error = "execute: " + first.get_message();
            continue;
          }
          // A plan whose outputs fail the check is still timed (its line says how fast the broken plan was), but it
          // is not a result.
          const std::string bad = check_outputs(m);
          p.ms = time_plan(d, pr, m, p.index, o, p.error);
          if (!bad.empty()) {
            p.error = "check: " + bad + p.error;
            ++r.bad;
            continue;
          }
          if (p.ms < 0) continue;
          auto better = [&](double& ms, std::string& tag) {
            if (ms < 0 || p.ms < ms) ms = p.ms, tag = p.tag;
          };
          better(r.ms, r.tag);
          better(p.rtc ? r.rtc_ms : r.pre_ms, p.rtc ? r.rtc_tag : r.pre_tag);
        }
        for (auto e : precompiled) r.pre_engines += (r.pre_engines.empty() ? "" : " ") + std::to_string(e);
        r.ok = r.ms >= 0;
        if (!r.ok) {
          for (const auto& p : plans) {
            if (!p.error.empty() && p.error.rfind("not built", 0) != 0) {
              r.error = p.error;
              break;
            }
          }
          if (r.error.empty()) r.error = plans.empty() ? "no plan: " + r.heur_errors : "no plan could be built";
        }
      }
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    r.supported = static_cast<int>(std::count(r.engines.begin(), r.engines.end(), '{'));
    if (o.enumerate && !o.dry) {
      for (const auto& p : plans) {
        std::fprintf(o.plans,
                     "{\"kind\": \"plan\", %s, \"index\": %lld, \"source\": \"%s\", \"engine\": %lld, \"tag\": \"%s\", "
                     "\"rtc\": %s, \"notes\": \"%s\", \"knobs\": \"%s\", \"workspace\": %lld, \"built\": %s, "
                     "\"ms\": %.5f, \"error\": \"%s\"}\n",
                     head.c_str(), (long long)p.index, p.source.c_str(), (long long)p.engine,
                     json_escape(p.tag).c_str(), p.rtc ? "true" : "false", p.notes.c_str(),
                     json_escape(p.knobs).c_str(), (long long)p.workspace, p.built ? "true" : "false", p.ms,
                     json_escape(p.error).c_str());
      }
      std::printf("{\"kind\": \"engines\", %s, \"global\": %lld, \"supported\": [%s]}\n", head.c_str(),
                  (long long)r.global, r.engines.c_str());
    }
    if (!key.empty()) done[key] = {l.name, r};
  }
  std::printf(
      "{\"kind\": \"graph\", %s, \"shape\": \"%s\", \"count\": %d, \"ok\": %s, \"ms\": %.5f, \"plans\": %lld, "
      "\"built\": %d, \"tag\": \"%s\", \"pre_ms\": %.5f, \"pre_tag\": \"%s\", \"rtc_ms\": %.5f, \"rtc_tag\": \"%s\", "
      "\"precompiled_engines\": \"%s\", \"engines_supported\": %d, \"engines_global\": %lld, \"bad_output\": %d, "
      "\"lite\": %s, \"same_as\": \"%s\", \"enumerated\": %s, \"types\": \"%s\", \"heur_errors\": \"%s\", "
      "\"seconds\": %.2f, \"error\": \"%s\"}\n",
      head.c_str(), shape.str().c_str(), l.count, r.ok ? "true" : "false", r.ms, (long long)r.plans, r.built,
      json_escape(r.tag).c_str(), r.pre_ms, json_escape(r.pre_tag).c_str(), r.rtc_ms, json_escape(r.rtc_tag).c_str(),
      r.pre_engines.c_str(), r.supported, (long long)r.global, r.bad, r.lite ? "true" : "false", same_as.c_str(),
      o.enumerate ? "true" : "false", json_escape(r.types).c_str(), json_escape(r.heur_errors).c_str(), since(t0),
      json_escape(r.error).c_str());
  std::fflush(stdout);
  std::fflush(o.plans);
}

}  // namespace probe
