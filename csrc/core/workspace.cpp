#include "workspace.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device.h"
#include "error.h"

namespace rn {
namespace {

constexpr size_t kGranularity = size_t(1) << 20;  // Round up: avoids a regrow for every few extra bytes.

std::mutex g_mutex;
size_t g_limit = SIZE_MAX;
std::function<void()>* g_oom_hook = nullptr;  // Leaked on purpose: may hold a Python object at exit.

std::vector<std::unique_ptr<WorkspacePool>>& pools() {
  static auto* p = new std::vector<std::unique_ptr<WorkspacePool>>();
  return *p;
}

std::string mib(size_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

// A stream's process-unique id (handle values are reused once a stream is destroyed); 0 when it cannot be told.
unsigned long long stream_id(cudaStream_t stream) {
  unsigned long long id = 0;
  if (cudaStreamGetId(stream, &id) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return id;
}

}  // namespace

WorkspacePool& WorkspacePool::current() {
  const int device = current_device();
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& p = pools();
  if (static_cast<int>(p.size()) <= device) p.resize(device + 1);
  if (!p[device]) {
    p[device] = std::make_unique<WorkspacePool>();
    p[device]->limit_ = g_limit;
  }
  return *p[device];
}

void WorkspacePool::count_request(size_t bytes) {
  ++requests_;
  if (bytes > peak_request_) peak_request_ = bytes;
}

void* WorkspacePool::serve(size_t bytes, cudaStream_t stream, bool throw_on_failure, bool use) {
  void* data = bytes <= size_ ? data_ : grow(bytes, stream, throw_on_failure);
  if (use && (data != nullptr || bytes == 0) && bytes > peak_use_) peak_use_ = bytes;
  return data;
}

void* WorkspacePool::get(size_t bytes, cudaStream_t stream) {
  count_request(bytes);
  if (bytes > limit_) {
    throw ValueError("workspace request of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                     std::to_string(limit_) + " bytes (resnet_native.set_workspace_limit)");
  }
  return serve(bytes, stream, /*throw_on_failure=*/true);
}

void* WorkspacePool::get_required(size_t bytes, cudaStream_t stream) {
  count_request(bytes);
  return serve(bytes, stream, /*throw_on_failure=*/true);
}

void* WorkspacePool::try_get(size_t bytes, cudaStream_t stream) {
  count_request(bytes);
  if (bytes > limit_) return nullptr;
  return serve(bytes, stream, /*throw_on_failure=*/false);
}

void* WorkspacePool::try_get_for_search(size_t bytes, cudaStream_t stream) {
  count_request(bytes);
  if (bytes > limit_) return nullptr;
  return serve(bytes, stream, /*throw_on_failure=*/false, /*use=*/false);
}

void* WorkspacePool::try_get_for_choice(size_t bytes, cudaStream_t stream) {
  void* data = try_get(bytes, stream);
  if (data == nullptr && bytes > 0 && bytes <= limit_ && stream_is_capturing(stream)) return get(bytes, stream);
  return data;
}

void WorkspacePool::reserve(size_t bytes, cudaStream_t stream) {
  if (bytes > limit_) {
    throw ValueError("workspace reserve of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                     std::to_string(limit_) + " bytes");
  }
  if (bytes > size_) grow(bytes, stream, true);
  if (bytes > peak_use_) peak_use_ = bytes;
}

size_t WorkspacePool::trim(cudaStream_t stream) {
  if (graph_holds_ > 0 || stream_is_capturing(stream)) return 0;
  const size_t keep = (peak_use_ + kGranularity - 1) / kGranularity * kGranularity;
  if (size_ <= keep) return 0;
  const size_t freed = size_ - keep;
  // cudaFree synchronises the device, so work still reading the buffer finishes first.
  RN_CUDA_CHECK(cudaFree(data_));
  data_ = nullptr;
  size_ = 0;
  free_retired();
  if (keep > 0) grow(keep, stream, /*throw_on_failure=*/true);
  return freed;
}

void* WorkspacePool::grow(size_t bytes, cudaStream_t stream, bool throw_on_failure) {
  if (stream_is_capturing(stream)) {
    // cudaMalloc/cudaFree are illegal during capture: the caller must reserve() beforehand.
    if (!throw_on_failure) return nullptr;
    throw ValueError("workspace would grow from " + mib(size_) + " to " + mib(bytes) +
                     " during CUDA-graph capture; call resnet_native.reserve_workspace() before capturing");
  }
  const size_t rounded = (bytes + kGranularity - 1) / kGranularity * kGranularity;
  if (data_ && graph_holds_ > 0) {
    retired_.push_back(data_);  // a captured graph may still run on it
    retired_bytes_ += size_;
    data_ = nullptr;
    size_ = 0;
  } else if (data_) {
    // cudaFree synchronises the device, so work still reading the old buffer finishes first.
    RN_CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
    size_ = 0;
  }
  if (graph_holds_ == 0) free_retired();
  void* ptr = nullptr;
  cudaError_t err = cudaMalloc(&ptr, rounded);
  if (err == cudaErrorMemoryAllocation && g_oom_hook && *g_oom_hook) {
    cudaGetLastError();
    (*g_oom_hook)();
    err = cudaMalloc(&ptr, rounded);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (!throw_on_failure) return nullptr;
    throw CudaError(
        err, std::string(cudaGetErrorName(err)) + ": could not allocate " + mib(rounded) + " of cuDNN workspace");
  }
  data_ = ptr;
  size_ = rounded;
  if (size_ > peak_size_) peak_size_ = size_;
  ++grows_;
  return data_;
}

void WorkspacePool::release() {
  if (graph_holds_ > 0) {
    throw ValueError("the cuDNN workspace is in use by " + std::to_string(graph_holds_) +
                     " captured CUDA graph(s); release them before the workspace");
  }
  free_retired();
  if (data_) {
    RN_CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
    size_ = 0;
  }
  peak_use_ = 0;
  peak_size_ = 0;
}

void WorkspacePool::drop_graph_hold() {
  if (graph_holds_ > 0) --graph_holds_;
}

void WorkspacePool::free_retired() {
  for (void* p : retired_) RN_CUDA_CHECK(cudaFree(p));
  retired_.clear();
  retired_bytes_ = 0;
}

WorkspaceStats WorkspacePool::stats() const {
  // In WorkspaceStats' member order.
  return WorkspaceStats{size_,  peak_request_, peak_use_,    peak_size_,     limit_,
                        grows_, requests_,     graph_holds_, retired_bytes_, stream_waits_};
}

OrderedStream::OrderedStream(cudaStream_t s) : stream(s), capturing(stream_is_capturing(s)) {
  if (!capturing) id = stream_id(s);
}

void WorkspacePool::wait_for_last_user(const OrderedStream& s) {
  if (!last_recorded_ || s.capturing) return;
  if (s.id != 0 && s.id == last_stream_) return;  // the same stream: already in order
  RN_CUDA_CHECK(cudaStreamWaitEvent(s.stream, last_use_, 0));
  ++stream_waits_;
}

void WorkspacePool::mark_used(const OrderedStream& s) {
  if (s.capturing) return;
  if (!last_use_) RN_CUDA_CHECK(cudaEventCreateWithFlags(&last_use_, cudaEventDisableTiming));
  RN_CUDA_CHECK(cudaEventRecord(last_use_, s.stream));
  last_stream_ = s.id;
  last_recorded_ = true;
}

WorkspacePool::~WorkspacePool() {
  if (last_use_) cudaEventDestroy(last_use_);  // no throw from a destructor; at exit the context may be gone
}

WorkspaceOrder::WorkspaceOrder(cudaStream_t stream) : pool_(WorkspacePool::current()), stream_(stream) {
  pool_.wait_for_last_user(stream_);
}

WorkspaceOrder::~WorkspaceOrder() {
  try {
    pool_.mark_used(stream_);
  } catch (...) {
    // A failed record means a broken context: the next CUDA call reports it. Never throw from a destructor.
  }
}

void set_out_of_memory_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_oom_hook) g_oom_hook = new std::function<void()>();
  *g_oom_hook = std::move(hook);
}

void set_workspace_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_limit = bytes;
  for (auto& pool : pools()) {
    if (pool) pool->set_limit(bytes);
  }
}

size_t workspace_limit() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_limit;
}

}  // namespace rn
