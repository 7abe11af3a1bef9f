// rn::graph::choose / run and the plan cache's controls (the contract in graph_engine.h).
#include "graph_engine.h"

#include <memory>
#include <string>

#include "../../core/device.h"
#include "../../core/error.h"
#include "backend_tensor.h"
#include "conv_op_graph.h"
#include "engine_config.h"
#include "engine_search.h"
#include "plan_cache.h"
#include "plan_execution.h"

namespace rn::graph {
namespace {

std::string describe_for_error(const void* params) {
  return describe_problem(*static_cast<const ConvParams*>(params));
}

const char* operand_name(ConvDirection direction, int64_t uid) {
  switch (uid) {
    case kUidX:
      return direction == ConvDirection::BackwardData ? "dx" : "x";
    case kUidW:
      return direction == ConvDirection::BackwardFilter ? "dw" : "w";
    case kUidY:
      return direction == ConvDirection::Forward ? "y" : "dy";
    case kUidZ:
      return "z";
    case kUidScale:
      return "scale";
    default:
      return "bias";
  }
}

int64_t product(const int32_t* dims) {
  return int64_t(dims[0]) * dims[1] * dims[2] * dims[3];
}

// The bindings validate operands against the params; this re-checks what the graph relies on (presence,
// dtype, element count), so a dispatcher bug raises instead of reading out of bounds.
void check_operands(const ConvParams& p, const ConvOperands& ops) {
  const auto direction = static_cast<ConvDirection>(p.direction);
  const DType dtype = storage_dtype(static_cast<Precision>(p.precision));
  const bool quantized = is_quantized(static_cast<Precision>(p.precision));
  auto check = [&](const TensorView& t, int64_t uid, int64_t numel, DType expected) {
    const char* name = operand_name(direction, uid);
    if (!t.defined()) throw ValueError(std::string(name) + ": required by " + describe_problem(p));
    if (t.dtype != expected) {
      throw TypeError(std::string(name) + ": expected " + dtype_name(expected) + ", got " + t.describe() + " for " +
                      describe_problem(p));
    }
    if (t.numel() != numel) {
      throw ValueError(std::string(name) + ": " + t.describe() + " has " + std::to_string(t.numel()) +
                       " elements, expected " + std::to_string(numel) + " for " + describe_problem(p));
    }
  };
  check(ops.x, kUidX, product(p.x), dtype);
  check(ops.w, kUidW, product(p.w), dtype);
  check(ops.y, kUidY, product(p.y), p.y_dtype());
  if (p.epilogue & kEpilogueResidual) check(ops.z, kUidZ, product(p.y), dtype);
  if (p.epilogue & kEpilogueBias) check(ops.bias, kUidBias, p.y[1], quantized ? DType::F32 : dtype);
  if (p.epilogue & kEpilogueScale) check(ops.scale, kUidScale, p.y[1], DType::F32);
}

GraphConstants constants_for(const ConvParams& p, const ConvOperands& ops) {
  GraphConstants c;
  c.alpha1 = ops.alpha1;
  // alpha2 only exists in the graph with a residual; normalising it avoids needless distinct plans.
  c.alpha2 = (p.epilogue & kEpilogueResidual) ? ops.alpha2 : 1.0f;
  c.beta = ops.beta;
  for (int64_t uid : {kUidX, kUidW, kUidY, kUidZ, kUidBias, kUidScale}) {
    c.alignment[uid] = static_cast<uint8_t>(pointer_alignment(operand_pointer(ops, uid)));
  }
  return c;
}

// The tensors, operations and finalized operation graph of a problem. A graph cuDNN refuses outright names
// the problem.
std::shared_ptr<ConvOpGraph> finalized_graph(const ConvParams& p, const GraphConstants& c, cudnnHandle_t handle) {
  auto graph = std::make_shared<ConvOpGraph>(build_conv_operations(p, c));
  try {
    finalize_op_graph(*graph, handle);
  } catch (const CudnnError& e) {
    throw CudnnError(e.status, "graph engine: cuDNN rejects the operation graph of " + describe_problem(p) + " (" +
                                   e.what() + "); engine='legacy' may support it");
  }
  return graph;
}

// The params part of a plan key. Fields that only say how the choice was made are normalised, so the same
// engine config reached through Find, Heuristic, Fixed or 'auto' shares one plan. (Determinism and the
// workspace cap stay: run() may serve a key with a heuristic fallback plan, which must have been chosen under
// the same constraints.)
ConvParams plan_params(const ConvParams& p) {
  ConvParams keyed = p;
  keyed.engine = static_cast<uint8_t>(ConvEngineKind::Graph);
  keyed.algo_mode = 0;
  keyed.fixed_algo = 0;
  return keyed;
}

}  // namespace

AlgoChoice choose(const ConvParams& params, const ConvOperands& ops, cudnnHandle_t handle, cudaStream_t stream) {
  OpContext context(&describe_for_error, &params);
  const auto mode = static_cast<AlgoMode>(params.algo_mode);
  check_operands(params, ops);
  if (mode == AlgoMode::Find && stream_is_capturing(stream)) {
    throw ValueError(
        "graph engine: algorithm search (find) cannot time candidates during CUDA-graph capture; "
        "run once before capturing for " +
        describe_problem(params));
  }
  const GraphConstants constants = constants_for(params, ops);
  const std::shared_ptr<ConvOpGraph> graph = finalized_graph(params, constants, handle);

  const SearchResult found = mode == AlgoMode::Fixed ? fixed_plan(params, graph, params.fixed_algo, handle)
                                                     : search_plan(params, graph, ops, mode, handle, stream);
  const ConvParams keyed = plan_params(params);
  // (Keeps an already cached plan of the same key, e.g. one a captured graph launches, rather than replace it.)
  PlanCache::instance().insert(PlanKeyRef{keyed, constants, found.plan->engine_id, found.plan->knobs}, found.plan);

  AlgoChoice choice;
  choice.engine = static_cast<uint8_t>(ConvEngineKind::Graph);
  choice.mode = static_cast<uint8_t>(mode);
  choice.algo = static_cast<int32_t>(found.plan->engine_id);
  choice.knobs = found.plan->knobs;
  choice.workspace = static_cast<uint64_t>(found.plan->workspace);
  choice.time_ms = found.time_ms;
  choice.fused_path = params.epilogue != kEpilogueNone ? "fused" : "";
  return choice;
}

void run(const ConvParams& params, const AlgoChoice& choice, const ConvOperands& ops, cudnnHandle_t handle,
         cudaStream_t stream) {
  OpContext context(&describe_for_error, &params);
  if (choice.engine != static_cast<uint8_t>(ConvEngineKind::Graph)) {
    throw ValueError("graph engine: asked to run a choice of another engine for " + describe_problem(params));
  }
  check_operands(params, ops);
  const GraphConstants constants = constants_for(params, ops);
  const ConvParams keyed = plan_params(params);
  const PlanKeyRef key{keyed, constants, choice.algo, choice.knobs};  // borrowed: no copy of the knob string
  // A plan executed during a capture is pinned in the cache: the captured graph may launch its kernels for as
  // long as it lives, so eviction must never destroy it (plan_cache.h). `plan` keeps it alive meanwhile anyway.
  const bool capturing = stream_is_capturing(stream);
  std::shared_ptr<ExecutionPlan> plan = PlanCache::instance().find(key, capturing);
  if (!plan) {
    // A choice from the cache file, or new scalars / alignment: rebuild from engine index + knob choices.
    const std::shared_ptr<ConvOpGraph> graph = finalized_graph(params, constants, handle);
    try {
      plan = rebuild_plan(graph, choice.algo, choice.knobs, handle);
    } catch (const CudnnError& rebuild_error) {
      // The chosen engine cannot take this variant of the problem (e.g. a less aligned pointer than the one it
      // was chosen with): serve it with the heuristics' pick, cached under the same key, rather than fail.
      try {
        plan = search_plan(params, graph, ops, AlgoMode::Heuristic, handle, stream).plan;
      } catch (const CudnnError& search_error) {
        throw CudnnError(rebuild_error.status, "graph engine: cannot rebuild engine " + std::to_string(choice.algo) +
                                                   " (knobs '" + choice.knobs + "') for " + describe_problem(params) +
                                                   " (" + rebuild_error.what() + "), and " + search_error.what());
      }
    }
    plan = PlanCache::instance().insert(key, std::move(plan), capturing);
  }
  execute_plan(*plan, ops, handle, stream);
}

void clear_plans() {
  PlanCache::instance().clear();
}

size_t num_plans() {
  return PlanCache::instance().size();
}

void set_plan_cache_capacity(size_t capacity) {
  PlanCache::instance().set_capacity(capacity);
}

PlanCacheStats plan_cache_stats() {
  return PlanCache::instance().stats();
}

}  // namespace rn::graph
