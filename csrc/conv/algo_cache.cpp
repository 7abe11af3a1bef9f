#include "algo_cache.h"

namespace rn {

AlgoCache& AlgoCache::global() {
  static AlgoCache* cache = new AlgoCache();  // Never destroyed: may be used from other static destructors.
  return *cache;
}

AlgoCache::Entry AlgoCache::lookup(const ConvParams& params) {
  Entry entry;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const Entry* found = map_.find(params)) entry = *found;
  }
  (entry ? hits_ : misses_).fetch_add(1, std::memory_order_relaxed);
  return entry;
}

AlgoCache::Entry AlgoCache::peek(const ConvParams& params) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Entry* found = map_.peek(params);
  return found ? *found : nullptr;
}

AlgoCache::Entry AlgoCache::insert(const ConvParams& params, AlgoChoice choice) {
  auto entry = std::make_shared<const AlgoChoice>(std::move(choice));
  std::vector<Entry> evicted;  // released after the lock (declared first, destroyed last)
  std::lock_guard<std::mutex> lock(mutex_);
  map_.insert(params, entry, &evicted);
  return entry;
}

void AlgoCache::set_fused_path(const ConvParams& params, const std::string& fused_path) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* found = map_.peek(params);
  if (!found || (*found)->fused_path == fused_path) return;
  AlgoChoice updated = **found;
  updated.fused_path = fused_path;
  *found = std::make_shared<const AlgoChoice>(std::move(updated));
}

void AlgoCache::clear() {
  std::vector<Entry> dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  map_.clear(&dropped);
}

std::vector<std::pair<ConvParams, AlgoCache::Entry>> AlgoCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<ConvParams, Entry>> out;
  out.reserve(map_.size());
  map_.for_each_oldest_first([&out](const ConvParams& params, const Entry& entry) { out.emplace_back(params, entry); });
  return out;
}

void AlgoCache::set_capacity(size_t capacity) {
  std::vector<Entry> evicted;
  std::lock_guard<std::mutex> lock(mutex_);
  map_.set_capacity(capacity, &evicted);
}

size_t AlgoCache::capacity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.capacity();
}

AlgoCacheStats AlgoCache::stats() const {
  AlgoCacheStats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.finds = finds_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
  s.entries = static_cast<int64_t>(map_.size());
  s.capacity = static_cast<int64_t>(map_.capacity());
  s.evictions = map_.evictions();
  return s;
}

}  // namespace rn
