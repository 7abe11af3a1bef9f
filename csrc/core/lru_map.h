// A map of bounded size that forgets its least recently used entries: the one eviction policy of the caches
// (conv/algo_cache.h: choices; conv/graph/plan_cache.h: execution plans).
//
// Not thread-safe: each cache calls it under its own mutex, as it locked its map before.
//   find(q)       the value of the key equal to q, made the most recently used; nullptr when absent.
//   peek(q)       the same without touching the order (inspection, and in-place updates).
//   insert(k, v)  adds k -> v (or replaces the value of an equal key) as the most recently used, then evicts
//                 least recently used entries until size() <= capacity().
//   set_capacity  evicts at once down to the new capacity.
// Evicted values are moved into the caller's vector, so it can destroy them after releasing its lock (a plan's
// destruction destroys cuDNN descriptors); clear() hands its values over the same way. Evictions are counted;
// clear() and replacing a value are not evictions.
//
// Pinned entries (Pinned()(value) is true) are skipped by eviction, and the most recently used entry is never
// evicted, so with pins size() may exceed capacity(); without pins it never does (capacity() >= 1).
//
// Lookups take any query q for which Hash()(q) and Equal()(key, q) are defined, e.g. a key of borrowed fields
// (C++17's unordered_map has no heterogeneous lookup): the index maps a hash to the entries that have it, and
// Equal tells those apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

#include "error.h"

namespace rn {

struct NeverPinned {
  template <class Value>
  bool operator()(const Value&) const {
    return false;
  }
};

template <class Key, class Value, class Hash, class Equal = std::equal_to<>, class Pinned = NeverPinned>
class LruMap {
 public:
  // Throws ValueError below 1 (as set_capacity).
  explicit LruMap(size_t capacity) : capacity_(checked(capacity)) {}

  size_t size() const { return nodes_.size(); }
  size_t capacity() const { return capacity_; }
  int64_t evictions() const { return evictions_; }

  template <class Query>
  Value* find(const Query& query) {
    const Iterator* node = locate(query, Hash()(query));
    if (!node) return nullptr;
    nodes_.splice(nodes_.begin(), nodes_, *node);  // iterators stay valid: the index needs no update
    return &(*node)->value;
  }

  template <class Query>
  Value* peek(const Query& query) {
    const Iterator* node = locate(query, Hash()(query));
    return node ? &(*node)->value : nullptr;
  }

  template <class Query>
  const Value* peek(const Query& query) const {
    const Iterator* node = locate(query, Hash()(query));
    return node ? &(*node)->value : nullptr;
  }

  // The stored value (most recently used: never the one evicted). `evicted` may be null (values destroyed here).
  Value& insert(Key key, Value value, std::vector<Value>* evicted) {
    const size_t hash = Hash()(key);
    if (const Iterator* node = locate(key, hash)) {
      (*node)->value = std::move(value);
      nodes_.splice(nodes_.begin(), nodes_, *node);
      return (*node)->value;
    }
    nodes_.push_front(Node{std::move(key), std::move(value), hash});
    index_.emplace(hash, nodes_.begin());
    evict_to_capacity(evicted);
    return nodes_.front().value;
  }

  // Throws ValueError below 1.
  void set_capacity(size_t capacity, std::vector<Value>* evicted) {
    capacity_ = checked(capacity);
    evict_to_capacity(evicted);
  }

  // Empties the map; its values are appended to `dropped` when given.
  void clear(std::vector<Value>* dropped) {
    if (dropped) {
      dropped->reserve(dropped->size() + nodes_.size());
      for (Node& n : nodes_) dropped->push_back(std::move(n.value));
    }
    index_.clear();
    nodes_.clear();
  }

  // f(key, value) for every entry, the least recently used first.
  template <class F>
  void for_each_oldest_first(F&& f) const {
    for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) f(it->key, it->value);
  }

 private:
  struct Node {
    Key key;
    Value value;
    size_t hash;  // Hash()(key), kept so that removing a node does not hash its key again
  };
  using Nodes = std::list<Node>;  // most recently used first
  using Iterator = typename Nodes::iterator;

  static size_t checked(size_t capacity) {
    if (capacity < 1) throw ValueError("cache capacity must be at least 1 entry");
    return capacity;
  }

  // The index's iterator to the node whose key equals `query`, or nullptr.
  template <class Query>
  const Iterator* locate(const Query& query, size_t hash) const {
    const auto range = index_.equal_range(hash);
    for (auto it = range.first; it != range.second; ++it) {
      if (Equal()(it->second->key, query)) return &it->second;
    }
    return nullptr;
  }

  void unindex(Iterator node) {
    const auto range = index_.equal_range(node->hash);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == node) {
        index_.erase(it);
        return;
      }
    }
  }

  void evict_to_capacity(std::vector<Value>* evicted) {
    auto next_newer = nodes_.end();  // the scan goes from the least recently used towards the front
    while (nodes_.size() > capacity_) {
      const auto victim = std::prev(next_newer);
      if (victim == nodes_.begin()) return;  // the most recently used stays (only reached past pinned entries)
      if (Pinned()(victim->value)) {
        next_newer = victim;
        continue;
      }
      unindex(victim);
      if (evicted) evicted->push_back(std::move(victim->value));
      nodes_.erase(victim);  // next_newer stays valid: a list erase invalidates only the erased node
      ++evictions_;
    }
  }

  Nodes nodes_;
  std::unordered_multimap<size_t, Iterator> index_;
  size_t capacity_ = 1;
  int64_t evictions_ = 0;
};

}  // namespace rn
