// Running an execution plan: a variant pack binds the graph's non-virtual tensor ids to the operands' data
// pointers and the workspace, then cudnnBackendExecute launches. Nothing here allocates device memory (the
// workspace comes from WorkspacePool), so a run can be captured in a CUDA graph once the pool is large enough.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <memory>
#include <vector>

#include "../conv_params.h"
#include "plan_cache.h"

namespace rn::graph {

// The data pointer an operand uid (TensorUid) is bound to.
void* operand_pointer(const ConvOperands& ops, int64_t uid);

// Executes `plan` on `ops`; throws (CudnnError, or ValueError when the workspace exceeds the pool's limit).
// Reuses the plan's variant pack of the previous execution when the operand and workspace pointers are the
// same, else builds (and keeps) a new one: a call with unchanged buffers creates no descriptor at all.
void execute_plan(const ExecutionPlan& plan, const ConvOperands& ops, cudnnHandle_t handle, cudaStream_t stream);

// Times `plan` on `ops` with CUDA events: one warm-up run, then `runs` timed runs; returns the median in ms.
// Returns a negative value instead of throwing when the plan cannot run (workspace unavailable: -1, execution
// refused: -2), so the search can move on to the next candidate.
// `output` (a TensorUid) with `scratch_output` true: the runs write to a scratch region of the workspace pool
// instead of the real output, which must survive the search (gradient accumulation, y aliasing z).
float time_plan(const ExecutionPlan& plan, const ConvOperands& ops, cudnnHandle_t handle, cudaStream_t stream, int runs,
                int64_t output, bool scratch_output);

// Times several candidates for one problem as time_plan does (each: one warm-up, then the median of `rounds`
// runs; the same negative codes), but interleaved: `rounds` rounds of one run of each candidate, held behind a
// HostGate until all are queued, so they run back to back, and waited for once. Falls back to time_plan per candidate
// when the largest workspace and the scratch output cannot be had at once.
std::vector<float> time_plans(const std::vector<std::shared_ptr<ExecutionPlan>>& plans, const ConvOperands& ops,
                              cudnnHandle_t handle, cudaStream_t stream, int rounds, int64_t output,
                              bool scratch_output);

}  // namespace rn::graph
