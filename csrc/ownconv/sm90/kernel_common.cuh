// What every CUTLASS kernel of this folder shares, whatever its mainloop: the properties read off its CUTLASS types,
// and the shared-memory limit raised before its launch.
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cutlass/conv/convolution.h"
#include "cutlass/device_kernel.h"
#include "cutlass/kernel_hardware_info.hpp"

#include "../../core/error.h"
#include "../../core/launch_config.h"
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
