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

}  // namespace

bool PlanKey::operator==(const PlanKey& o) const {
  return params == o.params && same_constants(constants, o.constants) && engine_id == o.engine_id && knobs == o.knobs;
}

size_t PlanKeyHash::operator()(const PlanKey& k) const {
  size_t h = ConvParamsHash()(k.params);
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(float_bits(k.constants.alpha1));
  mix(float_bits(k.constants.alpha2));
  mix(float_bits(k.constants.beta));
  for (uint8_t a : k.constants.alignment) mix(a);
  mix(static_cast<uint64_t>(k.engine_id));
  mix(std::hash<std::string>()(k.knobs));
  return h;
}

PlanCache& PlanCache::instance() {
  static PlanCache* cache = new PlanCache();  // Leaked on purpose, like the cuDNN handles (core/device.h).
  return *cache;
}

std::shared_ptr<ExecutionPlan> PlanCache::find(const PlanKey& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : it->second;
}

void PlanCache::insert(const PlanKey& key, std::shared_ptr<ExecutionPlan> plan) {
  std::lock_guard<std::mutex> lock(mutex_);
  plans_[key] = std::move(plan);
}

void PlanCache::clear() {
  // Destroy outside the lock: descriptor destruction may take a while and must not block lookups.
  std::unordered_map<PlanKey, std::shared_ptr<ExecutionPlan>, PlanKeyHash> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped.swap(plans_);
  }
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plans_.size();
}

}  // namespace rn::graph
