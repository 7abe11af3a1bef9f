#include "plan_cache.h"

#include <cstring>
#include <functional>

namespace rn::graph {
namespace {

uint32_t float_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

bool same_constants(const GraphConstants& a, const GraphConstants& b) {
  // Bitwise on the floats: the graph is built from exactly these values.
  if (float_bits(a.alpha1) != float_bits(b.alpha1) || float_bits(a.alpha2) != float_bits(b.alpha2) ||
      float_bits(a.beta) != float_bits(b.beta)) {
    return false;
  }
  return std::memcmp(a.alignment, b.alignment, sizeof(a.alignment)) == 0;
}

size_t hash_key(const PlanKeyRef& k) {
  size_t h = ConvParamsHash()(k.params);
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(float_bits(k.constants.alpha1));
  mix(float_bits(k.constants.alpha2));
  mix(float_bits(k.constants.beta));
  for (uint8_t a : k.constants.alignment) mix(a);
  mix(static_cast<uint64_t>(k.engine_id));
  mix(std::hash<std::string_view>()(k.knobs));
  return h;
}

bool same_key(const PlanKey& stored, const PlanKeyRef& k) {
  return stored.params == k.params && same_constants(stored.constants, k.constants) &&
         stored.engine_id == k.engine_id && std::string_view(stored.knobs) == k.knobs;
}

}  // namespace

PlanCache& PlanCache::instance() {
  static PlanCache* cache = new PlanCache();  // Leaked on purpose, like the cuDNN handles (core/device.h).
  return *cache;
}

std::shared_ptr<ExecutionPlan> PlanCache::find(const PlanKeyRef& key) const {
  const size_t hash = hash_key(key);
  std::lock_guard<std::mutex> lock(mutex_);
  auto bucket = buckets_.find(hash);
  if (bucket == buckets_.end()) return nullptr;
  for (const Entry& e : bucket->second) {
    if (same_key(e.key, key)) return e.plan;
  }
  return nullptr;
}

void PlanCache::insert(const PlanKeyRef& key, std::shared_ptr<ExecutionPlan> plan) {
  const size_t hash = hash_key(key);
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry>& bucket = buckets_[hash];
  for (Entry& e : bucket) {
    if (same_key(e.key, key)) {
      e.plan = std::move(plan);
      return;
    }
  }
  bucket.push_back(Entry{key.to_key(), std::move(plan)});
  ++size_;
}

void PlanCache::clear() {
  // Destroy outside the lock: descriptor destruction may take a while and must not block lookups.
  Buckets dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped.swap(buckets_);
    size_ = 0;
  }
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return size_;
}

}  // namespace rn::graph
