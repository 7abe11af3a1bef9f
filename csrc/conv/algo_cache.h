// The process-wide algorithm cache: ConvParams -> AlgoChoice, shared by both engines (the graph engine stores
// engine id + knobs). Thread-safe. Entries are immutable once inserted (readers hold a shared_ptr), so a lookup
// never copies strings and an entry replaced or evicted concurrently stays valid for whoever is using it.
//
// Bounded (core/lru_map.h): past capacity() entries, inserting evicts the least recently used; an op's lookup
// makes its entry the most recently used, inspection (peek, entries) does not. An evicted problem is searched
// again on its next call, which is refused during CUDA-graph capture for algo='find' (as any cache miss is);
// captured graphs do not depend on entries (they launch cuDNN kernels, not choices).
//
// The cache file (resnet_native.ops.algo_cache) is written and read by Python, which checks the GPU name +
// cuDNN version header; C++ provides entries() and insert(), and the bindings check every key and choice. entries()
// lists the least recently used first, the order in which a load re-inserts them: a reload restores recency, and
// a file longer than the capacity leaves its last (most recently used) entries.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "../core/lru_map.h"
#include "conv_params.h"

namespace rn {

struct AlgoCacheStats {
  int64_t hits = 0;       // lookups that found an entry
  int64_t misses = 0;     // lookups that did not
  int64_t finds = 0;      // timed searches run (legacy cudnnFind*AlgorithmEx, graph engine timing)
  int64_t entries = 0;    // entries now
  int64_t capacity = 0;   // most entries kept
  int64_t evictions = 0;  // least recently used entries dropped to stay within capacity
};

class AlgoCache {
 public:
  using Entry = std::shared_ptr<const AlgoChoice>;

  // Generous: a ResNet-152 training run keys a few hundred problems (its distinct conv shapes x three directions,
  // fused variants, and with engine='auto' each engine's own key too); an entry costs a few hundred bytes. The
  // bound is for processes that see unboundedly many shapes (varying batch or image sizes), not for one model.
  static constexpr size_t kDefaultCapacity = 4096;

  // The one cache of the process.
  static AlgoCache& global();

  // The cached choice (now the most recently used), or nullptr; counts a hit or a miss.
  Entry lookup(const ConvParams& params);
  // Like lookup() but counts nothing and leaves the order alone (inspection from Python, the dispatcher's
  // side queries).
  Entry peek(const ConvParams& params) const;
  // Inserts or replaces, as the most recently used (evicting the least recently used past capacity); returns the
  // stored entry.
  Entry insert(const ConvParams& params, AlgoChoice choice);
  // Records which path a fused op took, keeping the rest of the entry and its place in the order (no-op when the
  // entry is gone).
  void set_fused_path(const ConvParams& params, const std::string& fused_path);
  void clear();
  // Every entry, the least recently used first.
  std::vector<std::pair<ConvParams, Entry>> entries() const;
  // At least 1 (ValueError otherwise); a smaller capacity evicts the least recently used entries at once.
  void set_capacity(size_t capacity);
  size_t capacity() const;

  void count_find() { finds_.fetch_add(1, std::memory_order_relaxed); }
  AlgoCacheStats stats() const;

 private:
  mutable std::mutex mutex_;
  LruMap<ConvParams, Entry, ConvParamsHash> map_{kDefaultCapacity};
  std::atomic<int64_t> hits_{0}, misses_{0}, finds_{0};
};

}  // namespace rn
