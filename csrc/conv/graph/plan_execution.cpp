#include "plan_execution.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "../../core/cuda_event.h"
#include "../../core/error.h"
#include "../../core/workspace.h"
#include "backend_attr.h"

namespace rn::graph {
namespace {

BackendDescriptor make_variant_pack(const ExecutionPlan& plan, const ConvOperands& ops, void* workspace) {
  std::vector<void*> pointers;
  pointers.reserve(plan.graph->io_uids.size());
  for (int64_t uid : plan.graph->io_uids) pointers.push_back(operand_pointer(ops, uid));
  BackendDescriptor pack = make_backend(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set_int64s(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, plan.graph->io_uids);
  set_pointers(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, pointers);
  set_pointer(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, workspace);
  finalize(pack.get());
  return pack;
}

// Whether `last` holds a pack bound to exactly these operand pointers and this workspace (then it is the pack
// make_variant_pack would build now: a pack holds nothing else).
bool binds(const ReusableVariantPack& last, const ExecutionPlan& plan, const ConvOperands& ops, void* workspace) {
  if (!last.pack || last.workspace != workspace) return false;
  const std::vector<int64_t>& uids = plan.graph->io_uids;
  if (last.pointers.size() != uids.size()) return false;
  for (size_t i = 0; i < uids.size(); ++i) {
    if (last.pointers[i] != operand_pointer(ops, uids[i])) return false;
  }
  return true;
}

}  // namespace

void* operand_pointer(const ConvOperands& ops, int64_t uid) {
  switch (uid) {
    case kUidX:
      return ops.x.data;
    case kUidW:
      return ops.w.data;
    case kUidY:
      return ops.y.data;
    case kUidZ:
      return ops.z.data;
    case kUidBias:
      return ops.bias.data;
    case kUidScale:
      return ops.scale.data;
    default:
      throw ValueError("graph engine: no operand has tensor uid " + std::to_string(uid));
  }
}

void execute_plan(const ExecutionPlan& plan, const ConvOperands& ops, cudnnHandle_t handle, cudaStream_t stream) {
  void* workspace = nullptr;
  if (plan.workspace > 0) workspace = WorkspacePool::current().get(static_cast<size_t>(plan.workspace), stream);
  ReusableVariantPack& last = plan.last_pack;
  std::lock_guard<std::mutex> lock(last.mutex);
  if (!binds(last, plan, ops, workspace)) {
    // Forget the old pack first: if building the new one throws, no stale pack is left to match later.
    last.pack.reset();
    BackendDescriptor pack = make_variant_pack(plan, ops, workspace);
    last.pointers.clear();
    for (int64_t uid : plan.graph->io_uids) last.pointers.push_back(operand_pointer(ops, uid));
    last.workspace = workspace;
    last.pack.emplace(std::move(pack));
  }
  RN_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan->get(), last.pack->get()));
}

namespace {

// The operands a timed run writes to: `ops` with the output moved to `scratch` when the real one must survive.
ConvOperands timed_operands(const ConvOperands& ops, int64_t output, void* scratch) {
  ConvOperands timed = ops;
  if (scratch) (output == kUidX ? timed.x : output == kUidW ? timed.w : timed.y).data = scratch;
  return timed;
}

size_t output_bytes(const ConvOperands& ops, int64_t output) {
  return (output == kUidX ? ops.x : output == kUidW ? ops.w : ops.y).nbytes();
}

}  // namespace

float time_plan(const ExecutionPlan& plan, const ConvOperands& ops, cudnnHandle_t handle, cudaStream_t stream, int runs,
                int64_t output, bool scratch_output) {
  // One pool request holds the workspace and, after it (256-byte aligned), the scratch output if any.
  const size_t workspace_bytes = workspace_part_bytes(static_cast<size_t>(plan.workspace));
  const size_t total = workspace_bytes + (scratch_output ? output_bytes(ops, output) : 0);
  void* base = nullptr;
  if (total > 0) {
    base = WorkspacePool::current().try_get_for_search(total, stream);
    if (!base) return -1.0f;
  }
  const ConvOperands timed =
      timed_operands(ops, output, scratch_output ? static_cast<char*>(base) + workspace_bytes : nullptr);
  BackendDescriptor pack = make_variant_pack(plan, timed, plan.workspace > 0 ? base : nullptr);
  // Warm-up: also the check that the engine accepts these operands at all.
  if (cudnnBackendExecute(handle, plan.plan->get(), pack.get()) != CUDNN_STATUS_SUCCESS) return -2.0f;

  const std::optional<float> ms = median_time_ms(
      stream, runs, [&] { return cudnnBackendExecute(handle, plan.plan->get(), pack.get()) == CUDNN_STATUS_SUCCESS; });
  return ms ? *ms : -2.0f;
}

std::vector<float> time_plans(const std::vector<std::shared_ptr<ExecutionPlan>>& plans, const ConvOperands& ops,
                              cudnnHandle_t handle, cudaStream_t stream, int rounds, int64_t output,
                              bool scratch_output) {
  std::vector<float> ms(plans.size(), -2.0f);
  // The runs are serialised on one stream, so one pool request serves every candidate: the largest workspace,
  // then the scratch output.
  size_t workspace_bytes = 0;
  for (const auto& plan : plans) workspace_bytes = std::max(workspace_bytes, workspace_part_bytes(plan->workspace));
  const size_t total = workspace_bytes + (scratch_output ? output_bytes(ops, output) : 0);
  void* base = total > 0 ? WorkspacePool::current().try_get_for_search(total, stream) : nullptr;
  if (total > 0 && !base) {  // not all at once: each candidate alone, as far as memory goes
    for (size_t i = 0; i < plans.size(); ++i)
      ms[i] = time_plan(*plans[i], ops, handle, stream, rounds, output, scratch_output);
    return ms;
  }
  const ConvOperands timed =
      timed_operands(ops, output, scratch_output ? static_cast<char*>(base) + workspace_bytes : nullptr);
  std::vector<size_t> runnable;
  std::vector<BackendDescriptor> packs;
  for (size_t i = 0; i < plans.size(); ++i) {
    BackendDescriptor pack = make_variant_pack(*plans[i], timed, plans[i]->workspace > 0 ? base : nullptr);
    // Warm-up: also the check that the engine accepts these operands at all.
    if (cudnnBackendExecute(handle, plans[i]->plan->get(), pack.get()) != CUDNN_STATUS_SUCCESS) continue;
    runnable.push_back(i);
    packs.push_back(std::move(pack));
  }
  if (runnable.empty()) return ms;
  // Round-robin, back to back, one event between consecutive runs, one wait at the end: every candidate sees the
  // same clocks (which still rise during a process's first searches) and runs as it would inside a step, not
  // after an idle gap.
  const size_t n = runnable.size();
  const size_t runs = n * static_cast<size_t>(std::max(rounds, 1));
  std::vector<bool> failed(n, false);
  TimedRuns clock(stream, runs);
  for (size_t r = 0; r < runs; ++r) {
    const size_t k = r % n;
    failed[k] = failed[k] ||
                cudnnBackendExecute(handle, plans[runnable[k]]->plan->get(), packs[k].get()) != CUDNN_STATUS_SUCCESS;
    clock.end_run();
  }
  const std::vector<float> all = clock.times_ms();
  std::vector<std::vector<float>> times(n);
  for (size_t r = 0; r < runs; ++r) times[r % n].push_back(all[r]);
  for (size_t k = 0; k < n; ++k) {
    if (!failed[k]) ms[runnable[k]] = median_ms(times[k]);
  }
  return ms;
}

}  // namespace rn::graph
