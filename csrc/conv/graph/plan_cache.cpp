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

size_t PlanCache::KeyHash::operator()(const PlanKeyRef& k) const {
  return hash_key(k);
}

size_t PlanCache::KeyHash::operator()(const PlanKey& k) const {
  return hash_key(PlanKeyRef{k.params, k.constants, k.engine_id, k.knobs});
}

bool PlanCache::KeyEqual::operator()(const PlanKey& stored, const PlanKeyRef& k) const {
  return same_key(stored, k);
}

bool PlanCache::KeyEqual::operator()(const PlanKey& stored, const PlanKey& k) const {
  return same_key(stored, PlanKeyRef{k.params, k.constants, k.engine_id, k.knobs});
}

void PlanCache::pin_slot(Slot& slot) {
  if (slot.pinned) return;
  slot.pinned = true;
  ++pinned_;
}

std::shared_ptr<ExecutionPlan> PlanCache::find(const PlanKeyRef& key, bool pin) {
  std::lock_guard<std::mutex> lock(mutex_);
  Slot* slot = plans_.find(key);
  if (!slot) return nullptr;
  if (pin) pin_slot(*slot);
  return slot->plan;
}

std::shared_ptr<ExecutionPlan> PlanCache::insert(const PlanKeyRef& key, std::shared_ptr<ExecutionPlan> plan, bool pin) {
  // Destroyed after the lock is released (declared before it): destroying plans destroys descriptors, which
  // must not block lookups. `plan` itself, when a plan of the key is kept instead, is released on return too.
  std::vector<Slot> evicted;
  std::lock_guard<std::mutex> lock(mutex_);
  Slot* slot = plans_.find(key);
  if (!slot) slot = &plans_.insert(key.to_key(), Slot{std::move(plan), false}, &evicted);
  if (pin) pin_slot(*slot);
  return slot->plan;
}

void PlanCache::clear() {
  std::vector<Slot> dropped;  // destroyed outside the lock, as in insert()
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.clear(&dropped);
  pinned_ = 0;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plans_.size();
}

void PlanCache::set_capacity(size_t capacity) {
  std::vector<Slot> evicted;
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.set_capacity(capacity, &evicted);
}

PlanCacheStats PlanCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PlanCacheStats s;
  s.plans = static_cast<int64_t>(plans_.size());
  s.capacity = static_cast<int64_t>(plans_.capacity());
  s.evictions = plans_.evictions();
  s.pinned = pinned_;
  return s;
}

}  // namespace rn::graph
