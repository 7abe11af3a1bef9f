// The process-wide algorithm cache: ConvParams -> AlgoChoice, shared by both engines (the graph engine stores
// engine id + knobs). Thread-safe. Entries are immutable once inserted (readers hold a shared_ptr), so a lookup
// never copies strings and an entry replaced concurrently stays valid for whoever is using it.
//
// The cache file (resnet_native.conv.save_algorithm_cache / load_algorithm_cache) is written and read by
// Python, which checks the GPU name + cuDNN version header; C++ only provides entries() and insert().
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "conv_params.h"

namespace rn {

struct AlgoCacheStats {
  int64_t hits = 0;     // lookups that found an entry
  int64_t misses = 0;   // lookups that did not
  int64_t finds = 0;    // timed searches run (legacy cudnnFind*AlgorithmEx, graph engine timing)
  int64_t entries = 0;  // entries now
};

class AlgoCache {
 public:
  using Entry = std::shared_ptr<const AlgoChoice>;

  // The one cache of the process.
  static AlgoCache& global();

  // The cached choice, or nullptr; counts a hit or a miss.
  Entry lookup(const ConvParams& params);
  // Like lookup() but counts nothing (inspection from Python).
  Entry peek(const ConvParams& params) const;
  // Inserts or replaces; returns the stored entry.
  Entry insert(const ConvParams& params, AlgoChoice choice);
  // Records which path a fused op took, keeping the rest of the entry (no-op when the entry is gone).
  void set_fused_path(const ConvParams& params, const std::string& fused_path);
  void clear();
  std::vector<std::pair<ConvParams, Entry>> entries() const;

  void count_find() { finds_.fetch_add(1, std::memory_order_relaxed); }
  AlgoCacheStats stats() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<ConvParams, Entry, ConvParamsHash> map_;
  std::atomic<int64_t> hits_{0}, misses_{0}, finds_{0};
};

}  // namespace rn
