#include "host_gate.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "error.h"

namespace rn {
namespace {

constexpr int kSlots = 64;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Wraparound-safe "flag has reached ticket" for a counter that only grows.
__device__ __forceinline__ bool reached(uint32_t flag, uint32_t ticket) {
  return static_cast<int32_t>(flag - ticket) >= 0;
}

__global__ void hold_until(const volatile uint32_t* flag, uint32_t ticket, uint64_t max_ns) {
  const uint64_t start = global_ns();
  while (!reached(*flag, ticket) && global_ns() - start < max_ns) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(500);
#endif
  }
}

// One page-locked, mapped block of flags for the process (portable: every device sees it), handed out per gate.
struct Flags {
  std::mutex mutex;
  volatile uint32_t* host = nullptr;  // nullptr: the block could not be had, gates do nothing
  bool tried = false;
  std::vector<int> free;

  // A slot, or -1 (no block).
  int take() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!tried) {
      tried = true;
      void* p = nullptr;
      if (cudaHostAlloc(&p, kSlots * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess) {
        host = static_cast<volatile uint32_t*>(p);
        for (int i = 0; i < kSlots; ++i) host[i] = 0;
        for (int i = kSlots - 1; i >= 0; --i) free.push_back(i);
      } else {
        (void)cudaGetLastError();  // refused: not an error of the op that asked
      }
    }
    if (free.empty()) return -1;
    const int slot = free.back();
    free.pop_back();
    return slot;
  }
  void give_back(int slot) {
    std::lock_guard<std::mutex> lock(mutex);
    free.push_back(slot);
  }
};

// Never freed: gates may be used until the process exits.
Flags& flags() {
  static Flags* f = new Flags();
  return *f;
}

}  // namespace

HostGate::HostGate(cudaStream_t stream) {
  Flags& f = flags();
  slot_ = f.take();
  if (slot_ < 0) return;
  ticket_ = f.host[slot_] + 1;  // the slot's earlier gates have all been released: the flag is at their ticket
  uint32_t* device = nullptr;
  if (cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), const_cast<uint32_t*>(f.host + slot_), 0) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    f.give_back(slot_);
    slot_ = -1;
    return;
  }
  hold_until<<<1, 1, 0, stream>>>(device, ticket_, kMaxHoldNs);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    release();
    RN_CUDA_CHECK(launched);
  }
}

void HostGate::release() {
  if (slot_ < 0) return;
  std::atomic_thread_fence(std::memory_order_release);
  flags().host[slot_] = ticket_;
  flags().give_back(slot_);
  slot_ = -1;
}

HostGate::~HostGate() {
  release();
}

}  // namespace rn
