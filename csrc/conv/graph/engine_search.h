// Choosing an execution plan for a finalized operation graph: candidates from engine heuristics (mode A, and
// FALLBACK when A yields no usable candidate), filtered by the numerical notes the settings forbid, by the
// workspace cap and by whether the plan finalizes; then the first one (Heuristic) or the fastest of the top
// kFindCandidates timed on the real operands (Find). Fixed mode builds one named engine.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>

#include "../conv_params.h"
#include "conv_op_graph.h"
#include "engine_config.h"
#include "plan_cache.h"

namespace rn::graph {

constexpr int kFindCandidates = 8;  // valid candidates timed by Find
constexpr int kFindRuns = 5;        // timed runs per candidate (after one warm-up), interleaved; the median counts

// "" when an engine with these numerical notes may run a problem of this precision and determinism setting, else
// why not: TF32 (tensor cores on fp32 data) in strict fp32, inputs down-converted, reduced-precision accumulation
// (every mode promises fp32 accumulation), non-deterministic results in deterministic mode. int8 / fp8 problems
// are only held to the determinism setting.
std::string forbidden_notes(Precision precision, bool deterministic, uint32_t notes);

// The workspace bound for candidates: params.workspace_cap and the workspace pool's limit, whichever is lower.
uint64_t workspace_bound(const ConvParams& params);

struct SearchResult {
  std::shared_ptr<ExecutionPlan> plan;
  float time_ms = -1.0f;  // Find: the median time of the winner
};

// Heuristic or Find mode. Throws CudnnError (naming the problem and why each candidate was rejected) when no
// engine can run it.
SearchResult search_plan(const ConvParams& params, const std::shared_ptr<ConvOpGraph>& graph, const ConvOperands& ops,
                         AlgoMode mode, cudnnHandle_t handle, cudaStream_t stream);

// Fixed mode: engine `engine_id` with the knob choices heuristics give it (its defaults when heuristics do not
// list it). Throws ValueError when the settings forbid the engine or its workspace exceeds the bound, and
// CudnnError when the engine does not support the problem.
SearchResult fixed_plan(const ConvParams& params, const std::shared_ptr<ConvOpGraph>& graph, int64_t engine_id,
                        cudnnHandle_t handle);

// Rebuilds the plan of a recorded choice (engine index + knob choices), e.g. after an algorithm-cache load.
std::shared_ptr<ExecutionPlan> rebuild_plan(const std::shared_ptr<ConvOpGraph>& graph, int64_t engine_id,
                                            const std::string& knobs, cudnnHandle_t handle);

}  // namespace rn::graph
