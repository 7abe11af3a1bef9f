#include "engine_search.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "../../core/error.h"
#include "../../core/workspace.h"
#include "plan_execution.h"

namespace rn::graph {
namespace {

// Why candidates were turned down, for the error raised when none is left.
struct Rejections {
  int offered = 0;
  int by_notes = 0;
  int by_workspace = 0;
  int by_finalize = 0;
  int by_execution = 0;
  std::string heuristics_error;  // a heuristics query that itself failed
  std::string last_reason;

  std::string summary() const {
    std::string s = "heuristics offered " + std::to_string(offered) + " engine configs";
    if (offered) {
      s += " (" + std::to_string(by_notes) + " excluded by numerical notes, " + std::to_string(by_workspace) +
           " over the workspace bound, " + std::to_string(by_finalize) + " failed to finalize, " +
           std::to_string(by_execution) + " failed to execute)";
    }
    if (!heuristics_error.empty()) s += "; heuristics query failed: " + heuristics_error;
    if (!last_reason.empty()) s += "; last rejection: " + last_reason;
    return s;
  }
};

std::shared_ptr<ExecutionPlan> new_plan(const std::shared_ptr<ConvOpGraph>& graph, BackendDescriptor plan,
                                        std::vector<BackendDescriptor> config_parts, int64_t engine_id,
                                        const KnobChoices& knobs) {
  auto p = std::make_shared<ExecutionPlan>();
  p->graph = graph;
  p->config_parts = std::move(config_parts);
  p->workspace = plan_workspace(plan.get());
  p->plan = std::make_unique<BackendDescriptor>(std::move(plan));
  p->engine_id = engine_id;
  p->knobs = format_knobs(knobs);
  return p;
}

std::vector<BackendDescriptor> try_heuristics(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                                              Rejections& why) {
  try {
    return heuristic_configs(graph, mode);
  } catch (const CudnnError& e) {
    // A heuristics mode may refuse a graph outright (NOT_SUPPORTED); the other mode may still have engines.
    why.heuristics_error = e.what();
    return {};
  }
}

Precision precision_of(const ConvParams& params) {
  return static_cast<Precision>(params.precision);
}

[[noreturn]] void throw_unsupported(const ConvParams& params, const Rejections& why) {
  throw CudnnError(CUDNN_STATUS_NOT_SUPPORTED, "graph engine: no cuDNN engine supports " + describe_problem(params) +
                                                   " (" + why.summary() + "); engine='legacy' may support it");
}

}  // namespace

std::string forbidden_notes(Precision precision, bool deterministic, uint32_t notes) {
  auto has = [notes](cudnnBackendNumericalNote_t n) { return (notes & (1u << n)) != 0; };
  if (deterministic && has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) {
    return "the engine is non-deterministic and deterministic mode is on";
  }
  // 8-bit data is already the reduced precision asked for (Hopper's FP8 tensor cores also accumulate in less than
  // fp32): the notes below only guard the float precisions' promises.
  if (is_quantized(precision)) return "";
  if (precision == Precision::FP32 && has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE)) {
    return "tensor cores on fp32 data mean TF32, which strict fp32 forbids";
  }
  if (has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return "the engine down-converts its inputs";
  if (has(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)) {
    return "the engine accumulates in reduced precision (every precision mode promises fp32 accumulation)";
  }
  if (deterministic && has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) {
    return "the engine is non-deterministic and deterministic mode is on";
  }
  return "";
}

uint64_t workspace_bound(const ConvParams& params) {
  const size_t pool_limit = WorkspacePool::current().limit();
  return std::min<uint64_t>(params.workspace_cap, static_cast<uint64_t>(pool_limit));
}

SearchResult search_plan(const ConvParams& params, const std::shared_ptr<ConvOpGraph>& graph, const ConvOperands& ops,
                         AlgoMode mode, cudnnHandle_t handle, cudaStream_t stream) {
  const size_t wanted = mode == AlgoMode::Find ? kFindCandidates : 1;
  const uint64_t bound = workspace_bound(params);
  Rejections why;
  std::vector<std::shared_ptr<ExecutionPlan>> valid;

  for (cudnnBackendHeurMode_t heur_mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<BackendDescriptor> configs = try_heuristics(graph->graph->get(), heur_mode, why);
    why.offered += static_cast<int>(configs.size());
    for (BackendDescriptor& config : configs) {
      if (valid.size() >= wanted) break;
      EngineInfo info;
      try {
        info = inspect_config(config.get());
      } catch (const CudnnError& e) {
        ++why.by_finalize;
        why.last_reason = e.what();
        continue;
      }
      const std::string forbidden = forbidden_notes(precision_of(params), params.deterministic, info.notes);
      if (!forbidden.empty()) {
        ++why.by_notes;
        why.last_reason = "engine " + std::to_string(info.engine_id) + ": " + forbidden;
        continue;
      }
      const std::string knobs = format_knobs(info.knobs);
      const bool duplicate = std::any_of(valid.begin(), valid.end(), [&](const auto& p) {
        return p->engine_id == info.engine_id && p->knobs == knobs;
      });
      if (duplicate) continue;
      std::shared_ptr<ExecutionPlan> plan;
      try {
        BackendDescriptor finalized = make_plan(handle, config.get());
        std::vector<BackendDescriptor> parts;
        parts.push_back(std::move(config));
        plan = new_plan(graph, std::move(finalized), std::move(parts), info.engine_id, info.knobs);
      } catch (const CudnnError& e) {
        ++why.by_finalize;
        why.last_reason = "engine " + std::to_string(info.engine_id) + ": " + e.what();
        continue;
      }
      if (static_cast<uint64_t>(plan->workspace) > bound) {
        ++why.by_workspace;
        why.last_reason = "engine " + std::to_string(info.engine_id) + " needs " + std::to_string(plan->workspace) +
                          " bytes of workspace, over the bound of " + std::to_string(bound);
        continue;
      }
      valid.push_back(std::move(plan));
    }
    if (!valid.empty()) break;  // FALLBACK only when mode A yields nothing usable.
  }
  if (valid.empty()) throw_unsupported(params, why);

  if (mode != AlgoMode::Find) return {valid.front(), -1.0f};

  // The output must survive the search when the op accumulates into it or when y is also the residual z.
  const auto direction = static_cast<ConvDirection>(params.direction);
  const int64_t output = direction == ConvDirection::Forward        ? kUidY
                         : direction == ConvDirection::BackwardData ? kUidX
                                                                    : kUidW;
  const bool scratch_output = ops.beta != 0.0f || ((params.epilogue & kEpilogueResidual) && ops.z.data == ops.y.data);
  SearchResult best;
  int execution_failures = 0;
  const std::vector<float> times = time_plans(valid, ops, handle, stream, kFindRuns, output, scratch_output);
  for (size_t i = 0; i < valid.size(); ++i) {
    const std::shared_ptr<ExecutionPlan>& plan = valid[i];
    const float ms = times[i];
    if (ms < 0.0f) {
      ++why.by_execution;
      execution_failures += ms != -1.0f;
      why.last_reason =
          "engine " + std::to_string(plan->engine_id) +
          (ms == -1.0f ? ": workspace (and scratch output) could not be allocated" : ": execution failed");
      continue;
    }
    if (!best.plan || ms < best.time_ms) best = {plan, ms};
  }
  // Nothing could be timed only for lack of memory (the scratch output comes on top of the workspace): the
  // heuristics' first choice still fits the bound, so run that untimed rather than fail.
  if (!best.plan && execution_failures == 0) return {valid.front(), -1.0f};
  if (!best.plan) throw_unsupported(params, why);
  return best;
}

SearchResult fixed_plan(const ConvParams& params, const std::shared_ptr<ConvOpGraph>& graph, int64_t engine_id,
                        cudnnHandle_t handle) {
  const std::string problem = describe_problem(params);
  uint32_t notes = 0;
  try {
    notes = engine_notes(graph->graph->get(), engine_id);
  } catch (const CudnnError& e) {
    throw CudnnError(e.status, "graph engine: engine " + std::to_string(engine_id) + " does not support " + problem +
                                   " (" + e.what() + ")");
  }
  const std::string forbidden = forbidden_notes(precision_of(params), params.deterministic, notes);
  if (!forbidden.empty()) {
    throw ValueError("graph engine: engine " + std::to_string(engine_id) + " cannot run " + problem + ": " + forbidden);
  }

  // The heuristics' knob choices for this engine are tuned to the problem; the engine's defaults are not.
  KnobChoices knobs;
  Rejections ignored;
  bool listed = false;
  for (cudnnBackendHeurMode_t heur_mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (const BackendDescriptor& config : try_heuristics(graph->graph->get(), heur_mode, ignored)) {
      try {
        EngineInfo info = inspect_config(config.get());
        if (info.engine_id == engine_id) {
          knobs = std::move(info.knobs);
          listed = true;
          break;
        }
      } catch (const CudnnError&) {
        continue;
      }
    }
    if (listed) break;
  }

  std::shared_ptr<ExecutionPlan> plan;
  try {
    plan = rebuild_plan(graph, engine_id, format_knobs(knobs), handle);
  } catch (const CudnnError& e) {
    throw CudnnError(e.status, "graph engine: engine " + std::to_string(engine_id) + " does not support " + problem +
                                   " (" + e.what() + ")");
  }
  const uint64_t bound = workspace_bound(params);
  if (static_cast<uint64_t>(plan->workspace) > bound) {
    throw ValueError("graph engine: engine " + std::to_string(engine_id) + " needs " + std::to_string(plan->workspace) +
                     " bytes of workspace for " + problem + ", over the bound of " + std::to_string(bound));
  }
  return {plan, -1.0f};
}

std::shared_ptr<ExecutionPlan> rebuild_plan(const std::shared_ptr<ConvOpGraph>& graph, int64_t engine_id,
                                            const std::string& knobs, cudnnHandle_t handle) {
  const KnobChoices choices = parse_knobs(knobs);
  BuiltConfig built = build_config(graph->graph->get(), engine_id, choices);
  BackendDescriptor finalized = make_plan(handle, built.config->get());
  std::vector<BackendDescriptor> parts = std::move(built.parts);
  parts.push_back(std::move(*built.config));
  return new_plan(graph, std::move(finalized), std::move(parts), engine_id, choices);
}

}  // namespace rn::graph
