// The cuDNN 9 graph (backend) API convolution engine: operation graphs for conv forward (with fused bias /
// residual / ReLU epilogues), backward-data and backward-filter; engine heuristics (mode A, FALLBACK when A
// yields nothing), optional timing of the top candidates, and execution plans cached per ConvParams.
// The legacy engine (legacy_engine.h) implements the same two functions; conv_dispatch.cpp chooses.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "../conv_params.h"

namespace rn::graph {

// Chooses an engine configuration for `params` by params.algo_mode (Find times the candidates on the given
// operands, whose outputs may be overwritten; Heuristic takes the first candidate that passes the filters; Fixed
// takes the engine named by params.fixed_algo). Candidates are filtered by the numerical notes the precision forbids
// (TF32 in strict fp32), by determinism when params.deterministic, and by params.workspace_cap. Throws CudnnError
// naming the shape when no engine supports the problem.
AlgoChoice choose(const ConvParams& params, const ConvOperands& ops, cudnnHandle_t handle, cudaStream_t stream);

// Runs `choice` (re-building and caching its execution plan if needed, e.g. after a cache-file load).
// Takes workspace from WorkspacePool; allocates nothing else, so it can be captured in a CUDA graph once the
// plan exists and the pool is large enough.
void run(const ConvParams& params, const AlgoChoice& choice, const ConvOperands& ops, cudnnHandle_t handle,
         cudaStream_t stream);

// Drops every cached execution plan (their descriptors are destroyed), pinned ones included.
void clear_plans();
// Number of cached execution plans.
size_t num_plans();
// Bounds the plan cache (at least 1, else ValueError); a smaller capacity evicts the least recently used plans at
// once. Plans executed during a CUDA-graph capture are pinned: never evicted (graph/plan_cache.h).
void set_plan_cache_capacity(size_t capacity);

struct PlanCacheStats {
  int64_t plans = 0;      // plans now
  int64_t capacity = 0;   // most plans kept (pinned ones aside)
  int64_t evictions = 0;  // least recently used plans dropped to stay within capacity
  int64_t pinned = 0;     // plans executed during a CUDA-graph capture, never evicted
};
PlanCacheStats plan_cache_stats();

}  // namespace rn::graph
