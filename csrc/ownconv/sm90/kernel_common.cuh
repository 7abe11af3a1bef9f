// What every CUTLASS kernel of this folder shares, whatever its mainloop: the properties read off its CUTLASS types,
// and the shared-memory limit raised before its launch.
#pragma once

#include <atomic>
#include <cstdint>

#include "cutlass/device_kernel.h"

#include "../../core/error.h"
#include "../own_conv.h"

namespace rn::ownconv::sm90 {

// An int8 kernel's KernelInfo from its CUTLASS types (Kernel, and Mainloop's stage count); the caller adds what its
// schedule sets (cluster, persistent).
template <class Kernel, class Mainloop>
KernelInfo int8_kernel_info(const char* name, Epilogue epilogue, int tile_m, int tile_n, int tile_k, int alignment) {
  KernelInfo info;
  info.name = name;
  info.in = DType::I8;
  info.out = DType::I8;
  info.epilogue = epilogue;
  info.tile_m = tile_m;
  info.tile_n = tile_n;
  info.tile_k = tile_k;
  info.stages = Mainloop::DispatchPolicy::Stages;
  info.smem_bytes = static_cast<int>(Kernel::SharedStorageSize);
  info.threads = static_cast<int>(Kernel::MaxThreadsPerBlock);
  info.channel_multiple = alignment;
  info.address_alignment = 16;
  info.sm = 90;
  return info;
}

// A kernel's shared memory exceeds the default 48 KiB: its limit is raised once per device (a function attribute,
// not a stream operation, so a capture may be in progress).
template <class Kernel>
void allow_shared_memory(int device) {
  static std::atomic<uint64_t> done{0};
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return;
  RN_CUDA_CHECK(cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Kernel::SharedStorageSize)));
  done.fetch_or(bit, std::memory_order_release);
}

}  // namespace rn::ownconv::sm90
