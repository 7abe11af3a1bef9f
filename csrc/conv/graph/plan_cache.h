// Finalized execution plans of the graph engine, cached per (ConvParams, graph constants, engine config).
//
// Why the key is wider than ConvParams: the graph API bakes alpha/beta and the operands' pointer alignment into
// the operation graph, while the algorithm cache (one AlgoChoice per ConvParams) is shared with the legacy
// engine, whose scalars are per-call arguments. A call with other scalars or a less aligned pointer therefore
// gets its own plan, rebuilt from the same engine index and knob choices.
//
// A plan keeps alive every descriptor it was built from (operation graph, engine config). Entries are held
// by shared_ptr so clear() during another thread's run() cannot free a plan that is executing.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "../../core/descriptor.h"
#include "../conv_params.h"
#include "conv_op_graph.h"

namespace rn::graph {

struct PlanKey {
  ConvParams params;
  GraphConstants constants;
  int64_t engine_id = -1;
  std::string knobs;

  bool operator==(const PlanKey& o) const;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const;
};

struct ExecutionPlan {
  std::shared_ptr<ConvOpGraph> graph;           // tensors, operations and the finalized operation graph
  std::vector<BackendDescriptor> config_parts;  // engine config (and the engine / knob choices it refers to)
  std::unique_ptr<BackendDescriptor> plan;      // the finalized CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
  int64_t workspace = 0;                        // bytes
  int64_t engine_id = -1;
  std::string knobs;
};

class PlanCache {
 public:
  // The process-wide cache (never destroyed: plans alive at exit are left to the driver's teardown).
  static PlanCache& instance();

  std::shared_ptr<ExecutionPlan> find(const PlanKey& key) const;
  void insert(const PlanKey& key, std::shared_ptr<ExecutionPlan> plan);
  void clear();
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<PlanKey, std::shared_ptr<ExecutionPlan>, PlanKeyHash> plans_;
};

}  // namespace rn::graph
