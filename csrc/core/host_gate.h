// Holding a stream until the host has queued a batch of work behind it. Timing runs queued behind a gate execute
// back to back, so the events between them measure the GPU alone: not the gaps left by a host thread that a
// loaded CPU preempts while it queues them (a trainer times its first steps while other processes decode data).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace rn {

class HostGate {
 public:
  // Queues the gate on `stream`: one GPU thread polling a page-locked flag. It opens on release(), or on its own
  // after kMaxHoldNs, so a host that never releases it cannot hang the stream. Without page-locked mapped memory
  // (refused) there is no gate and the work runs as it is queued.
  explicit HostGate(cudaStream_t stream);
  ~HostGate();  // releases it
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;

  void release();

  static constexpr uint64_t kMaxHoldNs = 50'000'000;

 private:
  int slot_ = -1;        // the flag's index in the process's page-locked block, -1: no gate
  uint32_t ticket_ = 0;  // the value the flag takes on release (slots are reused: a flag only grows)
};

}  // namespace rn
