// Running an execution plan: a variant pack binds the graph's non-virtual tensor ids to the operands' data
// pointers and the workspace, then cudnnBackendExecute launches. Nothing here allocates device memory (the
// workspace comes from WorkspacePool), so a run can be captured in a CUDA graph once the pool is large enough.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

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

}  // namespace rn::graph
