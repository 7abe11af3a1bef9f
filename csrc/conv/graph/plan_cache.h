// Finalized execution plans of the graph engine, cached per (ConvParams, graph constants, engine config).
//
// Why the key is wider than ConvParams: the graph API bakes alpha/beta and the operands' pointer alignment into
// the operation graph, while the algorithm cache (one AlgoChoice per ConvParams) is shared with the legacy
// engine, whose scalars are per-call arguments. A call with other scalars or a less aligned pointer therefore
// gets its own plan, rebuilt from the same engine index and knob choices.
//
// A plan keeps alive every descriptor it was built from (operation graph, engine config) and the variant pack
// of its last execution. Entries are held by shared_ptr so clear() during another thread's run() cannot free a
// plan that is executing.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
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
};

// A PlanKey's fields, borrowed: run() looks its plan up on every call and must not copy the knob string.
struct PlanKeyRef {
  const ConvParams& params;
  const GraphConstants& constants;
  int64_t engine_id;
  std::string_view knobs;

  PlanKey to_key() const { return PlanKey{params, constants, engine_id, std::string(knobs)}; }
};

// The variant pack of a plan's last execution, kept for the next one. A finalized pack only binds the graph's
// tensor uids to data pointers and the workspace pointer, so while those stay the same (a training step reuses
// its buffers, cupy's pool hands back the same blocks) it is executed again as is, instead of creating, setting,
// finalizing and destroying one per call; any other pointer rebuilds it (execute_plan). A pack whose buffers
// were freed meanwhile is harmless: it only runs for a call whose own (live) pointers are the ones it binds.
struct ReusableVariantPack {
  // Held while the pack is compared, rebuilt and executed: a cached plan is shared by every caller. (Ops run
  // under the GIL today, so it is uncontended; it keeps the plan safe without relying on that.)
  std::mutex mutex;
  std::vector<void*> pointers;  // bound in `pack`, in plan.graph->io_uids order
  void* workspace = nullptr;
  std::optional<BackendDescriptor> pack;  // empty before the first execution
};

struct ExecutionPlan {
  std::shared_ptr<ConvOpGraph> graph;           // tensors, operations and the finalized operation graph
  std::vector<BackendDescriptor> config_parts;  // engine config (and the engine / knob choices it refers to)
  std::unique_ptr<BackendDescriptor> plan;      // the finalized CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
  int64_t workspace = 0;                        // bytes
  int64_t engine_id = -1;
  std::string knobs;
  mutable ReusableVariantPack last_pack;  // a cache beside the (immutable) plan; destroyed with it
};

class PlanCache {
 public:
  // The process-wide cache (never destroyed: plans alive at exit are left to the driver's teardown).
  static PlanCache& instance();

  std::shared_ptr<ExecutionPlan> find(const PlanKeyRef& key) const;
  void insert(const PlanKeyRef& key, std::shared_ptr<ExecutionPlan> plan);
  void clear();
  size_t size() const;

 private:
  struct Entry {
    PlanKey key;
    std::shared_ptr<ExecutionPlan> plan;
  };
  using Buckets = std::unordered_map<size_t, std::vector<Entry>>;

  // Entries grouped by the hash of their whole key and told apart by comparing keys: unlike an
  // unordered_map<PlanKey, ...>, this can be searched with borrowed fields (C++17 has no heterogeneous lookup).
  mutable std::mutex mutex_;
  Buckets buckets_;
  size_t size_ = 0;
};

}  // namespace rn::graph
