// One grow-only device buffer per GPU, shared by every op that needs cuDNN workspace.
//
// Why one buffer: ops on a device run in stream order, so at most one op uses workspace at a time, and the
// largest request bounds the memory. The pool only grows outside CUDA-graph capture; code that will be
// captured calls reserve() first, and a request that would grow the pool during capture raises instead of
// allocating. The cap (set_limit) is also the workspace bound given to algorithm search.
//
// A captured CUDA graph keeps the buffer's address. While any graph holds the pool (add_graph_hold), growing
// retires the old buffer instead of freeing it, and release() refuses; retired buffers are freed once the
// last hold is dropped (at the next grow or release).
//
// Streams: ops on several streams share the one buffer safely because its users are ordered (WorkspaceOrder):
// an op that may take workspace makes its stream wait for the last user on another stream, and marks its own
// end with an event. A captured graph's replay is a user too (wait_for_last_user before it, mark_used after:
// the bindings' _workspace_order, cuda_graph.launch_ordered).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace rn {

// A part's size when one pool request is carved into several parts (workspace, scratch): rounded up to 256 bytes,
// so every part starts aligned for any dtype and for cuDNN.
constexpr size_t workspace_part_bytes(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

struct WorkspaceStats {
  size_t size = 0;           // bytes currently allocated
  size_t peak_request = 0;   // largest request seen (algorithm searches included)
  size_t peak_use = 0;       // largest request met to run an op or a chosen algorithm, or reserved (trim's floor)
  size_t peak_size = 0;      // largest the buffer has been (peak_use and peak_size: since the last release)
  size_t limit = 0;          // cap on requests (SIZE_MAX: none)
  int64_t grows = 0;         // number of (re)allocations
  int64_t requests = 0;      // number of get() calls
  int64_t graph_holds = 0;   // captured graphs using the buffer
  size_t retired = 0;        // bytes of old buffers kept for them
  int64_t stream_waits = 0;  // users made to wait for the last user on another stream
};

// A stream as the ordering sees it, asked once: whether it is capturing, and (if not) its process-unique id
// (cudaStreamGetId: handle values are reused once a stream is destroyed; 0 when it cannot be told).
struct OrderedStream {
  explicit OrderedStream(cudaStream_t s);
  cudaStream_t stream;
  bool capturing;
  unsigned long long id = 0;
};

class WorkspacePool {
 public:
  // The pool of the current device.
  static WorkspacePool& current();

  // A buffer of at least `bytes`, valid until the next call on this pool. Throws rn::ValueError when `bytes`
  // exceeds the limit, CudaError when the device is out of memory (after the OOM hook ran and a retry
  // failed).
  void* get(size_t bytes, cudaStream_t stream);
  // Like get(), but returns nullptr instead of throwing when the request cannot be met (algorithm fallback).
  void* try_get(size_t bytes, cudaStream_t stream);
  // try_get() for an algorithm search's candidates: such a request does not raise peak_use, so trim() can give
  // back what only the search needed (Find tries candidates that ask for gigabytes and then picks one that
  // needs far less).
  void* try_get_for_search(size_t bytes, cudaStream_t stream);
  // try_get() for an algorithm choice: while `stream` is capturing a CUDA graph the buffer cannot grow, so a
  // request within the limit that the buffer cannot meet raises get()'s capture error (reserve_workspace()
  // first) instead of returning nullptr. A capture then never narrows a choice to a smaller algorithm.
  void* try_get_for_choice(size_t bytes, cudaStream_t stream);
  // Scratch an op cannot run without (no algorithm or call avoids it): like get(), but not bounded by the
  // limit, which caps only the workspace that algorithm and call choices may trade for speed.
  void* get_required(size_t bytes, cudaStream_t stream);
  // Whether a request of `bytes` is within the limit (it may still fail for lack of memory).
  bool within_limit(size_t bytes) const { return bytes <= limit_; }

  void set_limit(size_t bytes) { limit_ = bytes; }
  size_t limit() const { return limit_; }
  // Grow to at least `bytes` now (before CUDA-graph capture).
  void reserve(size_t bytes, cudaStream_t stream);
  // Free the buffer (synchronises the device first, so in-flight ops finish with it). Throws rn::ValueError
  // while captured graphs hold the pool. Resets peak_use and peak_size.
  void release();
  // Shrink the buffer to peak_use (what the ops and chosen algorithms run since the last release asked for),
  // giving back what only searches needed. Returns the bytes freed: 0 while captured graphs hold the pool
  // (they keep its address) or `stream` is capturing. Synchronises the device when it frees.
  size_t trim(cudaStream_t stream);
  // A captured graph that uses the pool's buffer takes a hold for its lifetime (see the header comment).
  void add_graph_hold() { ++graph_holds_; }
  void drop_graph_hold();
  int64_t graph_holds() const { return graph_holds_; }
  WorkspaceStats stats() const;

  // Ordering across streams (see WorkspaceOrder). Nothing is waited for or recorded on a capturing stream: the
  // graph's replays are ordered instead.
  void wait_for_last_user(const OrderedStream& s);  // s waits for the last user's end, if on another stream
  void mark_used(const OrderedStream& s);           // records the end of s's use (so far)

  WorkspacePool() = default;
  WorkspacePool(const WorkspacePool&) = delete;
  WorkspacePool& operator=(const WorkspacePool&) = delete;
  ~WorkspacePool();

 private:
  void count_request(size_t bytes);  // requests_, peak_request_
  // The buffer, grown if too small; a met request that is a use (not a search's) raises peak_use_.
  void* serve(size_t bytes, cudaStream_t stream, bool throw_on_failure, bool use = true);
  void* grow(size_t bytes, cudaStream_t stream, bool throw_on_failure);
  void free_retired();

  void* data_ = nullptr;
  size_t size_ = 0;
  size_t peak_request_ = 0;
  size_t peak_use_ = 0;
  size_t peak_size_ = 0;
  size_t limit_ = SIZE_MAX;
  int64_t grows_ = 0;
  int64_t requests_ = 0;
  int64_t graph_holds_ = 0;
  std::vector<void*> retired_;  // old buffers that captured graphs may still use
  size_t retired_bytes_ = 0;
  cudaEvent_t last_use_ = nullptr;      // recorded at the end of the last use (created on first use)
  unsigned long long last_stream_ = 0;  // cudaStreamGetId of its stream (0: none recorded, or unknown)
  bool last_recorded_ = false;
  int64_t stream_waits_ = 0;
};

// Held by an op that may take workspace, for the op's duration (conv, batch-norm training and backward): orders
// its stream after the last user on another stream, and marks the op's end for the next one.
class WorkspaceOrder {
 public:
  explicit WorkspaceOrder(cudaStream_t stream);
  ~WorkspaceOrder();
  WorkspaceOrder(const WorkspaceOrder&) = delete;
  WorkspaceOrder& operator=(const WorkspaceOrder&) = delete;

 private:
  WorkspacePool& pool_;
  OrderedStream stream_;
};

// Called once when cudaMalloc fails, before the single retry. The bindings install one that frees cupy's
// cached blocks (cupy.get_default_memory_pool().free_all_blocks()), so both allocators share the card.
void set_out_of_memory_hook(std::function<void()> hook);

// Every device's pool limit (new and existing pools).
void set_workspace_limit(size_t bytes);
size_t workspace_limit();

}  // namespace rn
