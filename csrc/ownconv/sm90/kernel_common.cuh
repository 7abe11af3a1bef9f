// What the kernels of this folder share, whatever their mainloop: the properties read off a CUTLASS kernel's types
// (or a hand-written kernel's), the shared-memory limit raised before a launch and the CTAs an SM holds, and the
// hand-written kernels' TMA descriptors.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cutlass/conv/convolution.h"
#include "cutlass/cuda_host_adapter.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/kernel_hardware_info.hpp"

#include "../../core/device.h"
#include "../../core/error.h"
#include "../../core/launch_config.h"
#include "../own_conv.h"

namespace rn::ownconv::sm90 {

// An int8 kernel's KernelInfo: int8 in and out, channel counts a multiple of `channel_multiple`, 16-byte aligned
// operands (TMA), sm_90a; the caller adds what its schedule sets (cluster, persistent, gemm_1x1).
inline KernelInfo int8_info(const char* name, Epilogue epilogue, int tile_m, int tile_n, int tile_k, int stages,
                            int smem_bytes, int threads, int channel_multiple) {
  KernelInfo info;
  info.name = name;
  info.in = DType::I8;
  info.out = DType::I8;
  info.epilogue = epilogue;
  info.tile_m = tile_m;
  info.tile_n = tile_n;
  info.tile_k = tile_k;
  info.stages = stages;
  info.smem_bytes = smem_bytes;
  info.threads = threads;
  info.channel_multiple = channel_multiple;
  info.address_alignment = 16;
  info.sm = 90;
  return info;
}

// The same from a CUTLASS kernel's types (Kernel, and Mainloop's stage count).
template <class Kernel, class Mainloop>
KernelInfo int8_kernel_info(const char* name, Epilogue epilogue, int tile_m, int tile_n, int tile_k, int alignment) {
  return int8_info(name, epilogue, tile_m, tile_n, tile_k, Mainloop::DispatchPolicy::Stages,
                   static_cast<int>(Kernel::SharedStorageSize), static_cast<int>(Kernel::MaxThreadsPerBlock),
                   alignment);
}

// A hand-written persistent kernel's (halo_conv_sm90.cuh): 16-byte channel multiples for TMA;
// its unsupported() asks for its exact channel counts.
inline KernelInfo hand_written_int8_info(const char* name, Epilogue epilogue, int tile_m, int tile_n, int tile_k,
                                         int stages, int smem_bytes, int threads) {
  KernelInfo info = int8_info(name, epilogue, tile_m, tile_n, tile_k, stages, smem_bytes, threads, 16);
  info.persistent = true;
  return info;
}

// A TMA descriptor over int8 data at x of kRank dimensions (innermost first, byte strides of dimensions 1 and up),
// loading boxes of `box` elements without swizzle; coordinates outside the tensor read zeros. `kernel` names the
// kernel in the error.
template <int kRank>
CUtensorMap int8_tma_map(const std::string& kernel, const void* x, const cuuint64_t (&dims)[kRank],
                         const cuuint64_t (&strides)[kRank - 1], const cuuint32_t (&box)[kRank]) {
  CUtensorMap map;
  cuuint32_t element_strides[kRank];
  for (int i = 0; i < kRank; ++i) element_strides[i] = 1;
  const CUresult status = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, kRank, const_cast<void*>(x), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    throw std::runtime_error(kernel + ": encoding the input's TMA descriptor failed (CUresult " +
                             std::to_string(static_cast<int>(status)) + ")");
  }
  return map;
}

// The 2-D fprop problem of CUTLASS's ConvProblemShape for `p` (NHWC activations, KRSC filters, no dilation).
template <class ProblemShape>
ProblemShape conv_problem_shape(const ConvProblem& p) {
  typename ProblemShape::TensorExtent x{p.n, p.h, p.w, p.c};
  typename ProblemShape::TensorExtent w{p.k, p.r, p.s, p.c};
  typename ProblemShape::ShapePadding pad{p.pad_h, p.pad_w};
  typename ProblemShape::TraversalStride stride{p.stride_h, p.stride_w};
  typename ProblemShape::ShapeDilation dilation{1, 1};
  return ProblemShape(cutlass::conv::Mode::kCrossCorrelation, x, w, pad, pad, stride, dilation, 1);
}

// A kernel's shared memory exceeds the default 48 KiB: its limit (kBytes for the __global__ function kFunction) is
// raised once per device (a function attribute, not a stream operation, so a capture may be in progress).
template <auto kFunction, int kBytes>
void raise_shared_memory_limit(int device) {
  static std::atomic<uint64_t> done{0};
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return;
  RN_CUDA_CHECK(cudaFuncSetAttribute(kFunction, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  done.fetch_or(bit, std::memory_order_release);
}

// How many CTAs of kFunction (kThreads threads, kBytes of dynamic shared memory) fit on one SM of `device`, with
// its shared-memory limit raised first; the runtime is asked once per device (devices 0-63; others ask each time).
template <auto kFunction, int kThreads, int kBytes>
int resident_ctas_per_sm(int device) {
  static std::atomic<int> known[64] = {};
  const bool cached = device >= 0 && device < 64;
  if (cached) {
    const int n = known[device].load(std::memory_order_acquire);
    if (n > 0) return n;
  }
  raise_shared_memory_limit<kFunction, kBytes>(device);
  int per_sm = 0;
  RN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kFunction, kThreads, kBytes));
  if (per_sm < 1)
    throw std::runtime_error("a kernel's CTA does not fit on one SM (" + std::to_string(kBytes) +
                             " bytes of shared memory, " + std::to_string(kThreads) + " threads)");
  if (cached) known[device].store(per_sm, std::memory_order_release);
  return per_sm;
}

// Launches a hand-written persistent kernel over `ctas` CTAs' worth of work: at most as many CTAs as the SMs hold at
// once, each walking its share (none for no work).
template <auto kKernel, int kThreads, int kSharedBytes, class... Args>
void launch_persistent(int64_t ctas, cudaStream_t stream, const Args&... args) {
  const int per_sm = resident_ctas_per_sm<kKernel, kThreads, kSharedBytes>(current_device());
  const int64_t grid = std::min<int64_t>(ctas, int64_t{sm_count()} * per_sm);
  if (grid <= 0) return;
  kKernel<<<static_cast<unsigned>(grid), kThreads, kSharedBytes, stream>>>(args...);
  RN_CUDA_CHECK_LAUNCH();
}

// The same for a CUTLASS kernel type, launched as cutlass::device_kernel<Kernel>.
template <class Kernel>
void allow_shared_memory(int device) {
  raise_shared_memory_limit<cutlass::device_kernel<Kernel>, static_cast<int>(Kernel::SharedStorageSize)>(device);
}

// The current device as CUTLASS's KernelHardwareInfo.
inline cutlass::KernelHardwareInfo current_hardware() {
  int device = 0;
  RN_CUDA_CHECK(cudaGetDevice(&device));
  return {device, sm_count()};
}

// A ConvKernel that CUTLASS's GemmUniversal runs (the persistent kernels: gemm1x1_sm90.cuh, persistent_conv_sm90.cuh).
// Derived supplies Gemm (its device adapter), info(), unsupported() (which asks Gemm::can_implement, so a launch
// asks once) and arguments(problem, operands, epilogue, hardware) -> Gemm::Arguments.
template <class Derived>
class GemmUniversalConv : public ConvKernel {
 public:
  size_t workspace_bytes(const ConvProblem& p) const override {
    return Derived::Gemm::get_workspace_size(derived().arguments(p, {}, {}, current_hardware()));
  }

  // Host work only: the tile scheduler's workspace, when there is one, initialised on the stream; the TMA
  // descriptors and the parameters, passed by value with the launch, so a captured graph keeps its own copy.
  void launch(const ConvProblem& p, const ConvOperands& operands, const EpilogueArgs& epilogue, void* workspace,
              cudaStream_t stream) const override {
    using Gemm = typename Derived::Gemm;
    using Kernel = typename Gemm::GemmKernel;
    const std::string& name = derived().info().name;
    const std::string why = derived().unsupported(p);
    if (!why.empty()) throw ValueError(name + ": " + p.describe() + ": " + why);
    typename Gemm::Arguments args = derived().arguments(p, operands, epilogue, current_hardware());
    if (workspace != nullptr && Kernel::initialize_workspace(args, workspace, stream) != cutlass::Status::kSuccess) {
      throw std::runtime_error(name + ": initialising the tile scheduler's workspace failed");
    }
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
    allow_shared_memory<Kernel>(args.hw_info.device_id);
    const dim3 grid = Kernel::get_grid_shape(params);
    const dim3 block = Kernel::get_block_shape();
    cutlass::device_kernel<Kernel><<<grid, block, static_cast<int>(Kernel::SharedStorageSize), stream>>>(params);
    RN_CUDA_CHECK_LAUNCH();
  }

 private:
  const Derived& derived() const { return static_cast<const Derived&>(*this); }
};

}  // namespace rn::ownconv::sm90
