// Finalized execution plans of the graph engine, cached per (ConvParams, graph constants, engine config).
//
// Why the key is wider than ConvParams: the graph API bakes alpha/beta and the operands' pointer alignment into
// the operation graph, while the algorithm cache (one AlgoChoice per ConvParams) is shared with the legacy
// engine, whose scalars are per-call arguments. A call with other scalars or a less aligned pointer therefore
// gets its own plan, rebuilt from the same engine index and knob choices.
//
// A plan keeps alive every descriptor it was built from (operation graph, engine config) and the variant pack
// of its last execution. Plans are held by shared_ptr: the cache owns one reference and every caller of find() /
// insert() another for as long as it runs the plan, so neither clear() nor an eviction during another thread's
// run() can free a plan that is executing; the last holder destroys it.
//
// Bounded (core/lru_map.h): past capacity() plans, adding one evicts the least recently used. A CUDA graph that
// captured a plan's execution launches its kernels, which the plan may own (runtime-compiled engines; not
// confirmed: KNOWN_ISSUES.md, "Dropping the cached cuDNN plans"), so the plan is kept for as long as the graph
// may live: run() pins every plan it executes during a capture (find / insert with pin), and eviction skips
// pinned plans, which therefore stay until clear(), even past the capacity. clear()
// (resnet_native._drop_cached_descriptors, release_handles) drops pinned plans too, so it must still not be called
// while a captured graph lives.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../../core/descriptor.h"
#include "../../core/lru_map.h"
#include "../conv_params.h"
#include "graph_engine.h"
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
  // An execution plan holds its finalized descriptors and, for runtime-compiled engines, the compiled kernels:
  // PyTorch budgets about 200 KiB of host memory per cuDNN plan, so 1024 plans are about 200 MiB. A ResNet-152
  // training run needs one plan per graph-engine problem (a few hundred at most).
  static constexpr size_t kDefaultCapacity = 1024;

  // The process-wide cache (never destroyed: plans alive at exit are left to the driver's teardown).
  static PlanCache& instance();

  // The cached plan of `key`, made the most recently used, or nullptr. `pin`: keep it from eviction for good.
  std::shared_ptr<ExecutionPlan> find(const PlanKeyRef& key, bool pin = false);
  // Caches `plan` under `key` unless a plan of that key is cached already (then that one is kept: it is the same
  // engine configuration of the same graph, and may be the one a captured graph launches); returns the cached
  // plan, made the most recently used. `pin` as in find().
  std::shared_ptr<ExecutionPlan> insert(const PlanKeyRef& key, std::shared_ptr<ExecutionPlan> plan, bool pin = false);
  // Drops every plan, pinned ones included.
  void clear();
  size_t size() const;
  // At least 1 (ValueError otherwise); a smaller capacity evicts the least recently used unpinned plans at once.
  void set_capacity(size_t capacity);
  PlanCacheStats stats() const;

 private:
  struct Slot {
    std::shared_ptr<ExecutionPlan> plan;
    bool pinned = false;
  };
  struct IsPinned {
    bool operator()(const Slot& s) const { return s.pinned; }
  };
  // Hash and equality of a stored PlanKey against a stored or borrowed key (PlanKeyRef).
  struct KeyHash {
    size_t operator()(const PlanKey& k) const;
    size_t operator()(const PlanKeyRef& k) const;
  };
  struct KeyEqual {
    bool operator()(const PlanKey& stored, const PlanKey& k) const;
    bool operator()(const PlanKey& stored, const PlanKeyRef& k) const;
  };

  // Marks a slot pinned (counting it once).
  void pin_slot(Slot& slot);

  mutable std::mutex mutex_;
  LruMap<PlanKey, Slot, KeyHash, KeyEqual, IsPinned> plans_{kDefaultCapacity};
  int64_t pinned_ = 0;
};

}  // namespace rn::graph
