#include "algo_cache.h"

namespace rn {

AlgoCache& AlgoCache::global() {
  static AlgoCache* cache = new AlgoCache();  // Never destroyed: may be used from other static destructors.
  return *cache;
}

AlgoCache::Entry AlgoCache::lookup(const ConvParams& params) {
  Entry entry = peek(params);
  (entry ? hits_ : misses_).fetch_add(1, std::memory_order_relaxed);
  return entry;
}

AlgoCache::Entry AlgoCache::peek(const ConvParams& params) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = map_.find(params);
  return it == map_.end() ? nullptr : it->second;
}

AlgoCache::Entry AlgoCache::insert(const ConvParams& params, AlgoChoice choice) {
  auto entry = std::make_shared<const AlgoChoice>(std::move(choice));
  std::lock_guard<std::mutex> lock(mutex_);
  map_[params] = entry;
  return entry;
}

void AlgoCache::set_fused_path(const ConvParams& params, const std::string& fused_path) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = map_.find(params);
  if (it == map_.end() || it->second->fused_path == fused_path) return;
  AlgoChoice updated = *it->second;
  updated.fused_path = fused_path;
  it->second = std::make_shared<const AlgoChoice>(std::move(updated));
}

void AlgoCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  map_.clear();
}

std::vector<std::pair<ConvParams, AlgoCache::Entry>> AlgoCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<ConvParams, Entry>> out(map_.begin(), map_.end());
  return out;
}

AlgoCacheStats AlgoCache::stats() const {
  AlgoCacheStats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.finds = finds_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
  s.entries = static_cast<int64_t>(map_.size());
  return s;
}

}  // namespace rn
