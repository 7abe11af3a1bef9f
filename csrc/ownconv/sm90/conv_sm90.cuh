// One CUTLASS 4.x sm90 implicit-GEMM forward convolution behind ownconv::ConvKernel. Only the translation units of
// this folder include CUTLASS: the build compiles them for sm_90a alone, with CUTLASS's headers on their include
// path, and only where nvcc >= 12, "90" among the archs and the headers are all there (build_ext.py).
//
// Mainloop: CUTLASS's conv CollectiveBuilder for Sm90 kFprop: activations through TMA im2col, filters through
// tiled TMA, one producer warp group feeding one wgmma consumer warp group (CUTLASS 4.2's only schedule for
// convolutions; persistent_conv_sm90.cuh runs the same collective under its persistent GEMM kernels). Epilogue:
// TMA warp-specialised, running one of our visitor trees (requantize_epilogue.cuh). Mainloop stages: as many as fit
// beside the epilogue's shared memory (STAGES 0: one CTA per SM), or a fixed few, which leave room for two or more
// CTAs per SM, so that one CTA's epilogue overlaps another's mainloop, the only overlap this schedule has.
//
// Adding a kernel: a new .cu file here with one RN_OWNCONV_SM90(...) line (see the existing ones).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
// Before the conv headers: sm100_implicit_gemm_umma_warpspecialized.hpp uses KernelHardwareInfo undeclared.
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"

#include "../../core/error.h"
#include "../../core/launch_config.h"
#include "../registry.h"
#include "kernel_common.cuh"
#include "requantize_epilogue.cuh"

namespace rn::ownconv::sm90 {

template <class T>
struct ElementTraits;
template <>
struct ElementTraits<int8_t> {
  using Accumulator = int32_t;
};

template <class Element, Epilogue E, int TM, int TN, int TK, int Stages = 0, int CM = 1, int CN = 1>
class Sm90Conv final : public ConvKernel {
 public:
  using Accumulator = typename ElementTraits<Element>::Accumulator;
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Shape<cute::Int<TK>>>;
  using ClusterShape = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;
  using EpilogueTree = RequantizeEpilogue<E, TileShape, Element>;
  using ElementC = typename EpilogueTree::ElementC;
  static constexpr int kAlignment = 16 / sizeof(Element);  // elements per 16 bytes: TMA's unit

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, float, ElementC, cutlass::layout::TensorNHWC,
      kAlignment, Element, cutlass::layout::TensorNHWC, kAlignment, cutlass::epilogue::TmaWarpSpecialized,
      typename EpilogueTree::Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop, Element,
      cutlass::layout::TensorNHWC, kAlignment, Element, cutlass::layout::TensorNHWC, kAlignment, Accumulator, TileShape,
      ClusterShape,
      std::conditional_t<Stages == 0,
                         cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(
                             sizeof(typename CollectiveEpilogue::SharedStorage))>,
                         cutlass::conv::collective::StageCount<(Stages > 0 ? Stages : 2)>>,
      cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;

  using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

  static_assert(std::is_same_v<Element, int8_t>, "int8_kernel_info describes int8 kernels");

  explicit Sm90Conv(const char* name)
      : info_(int8_kernel_info<Kernel, CollectiveMainloop>(name, E, TM, TN, TK, kAlignment)) {
    info_.cluster_m = CM;
    info_.cluster_n = CN;
  }

  const KernelInfo& info() const override { return info_; }

  std::string unsupported(const ConvProblem& p) const override {
    if (p.c % kAlignment != 0) {
      return "C=" + std::to_string(p.c) + " is not a multiple of " + std::to_string(kAlignment) +
             " (TMA reads 16-byte rows of channels)";
    }
    if (p.k % kAlignment != 0) {
      return "K=" + std::to_string(p.k) + " is not a multiple of " + std::to_string(kAlignment) +
             " (TMA writes 16-byte rows of channels)";
    }
    if (Conv::can_implement(arguments(p, {}, {})) != cutlass::Status::kSuccess) {
      return "outside TMA im2col's limits (padding up to 256, filter extents up to 255, the im2col corners)";
    }
    return "";
  }

  size_t workspace_bytes(const ConvProblem& p) const override { return Conv::get_workspace_size(arguments(p, {}, {})); }

  void launch(const ConvProblem& p, const ConvOperands& operands, const EpilogueArgs& epilogue, void* workspace,
              cudaStream_t stream) const override {
    const std::string why = unsupported(p);
    if (!why.empty()) throw ValueError(info_.name + ": " + p.describe() + ": " + why);
    int device = 0;
    RN_CUDA_CHECK(cudaGetDevice(&device));
    typename Conv::Arguments args = arguments(p, operands, epilogue);
    args.hw_info.device_id = device;
    args.hw_info.sm_count = sm_count();
    // Host work only: the TMA descriptors (cuTensorMapEncode*, through the runtime's driver entry point) and
    // the kernel's parameters, passed by value with the launch, so a captured graph keeps its own copy.
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
    allow_shared_memory<Kernel>(device);
    const dim3 grid = Kernel::get_grid_shape(params);
    const dim3 block = Kernel::get_block_shape();
    const int smem = static_cast<int>(Kernel::SharedStorageSize);
    if constexpr (CM * CN == 1) {
      cutlass::device_kernel<Kernel><<<grid, block, smem, stream>>>(params);
    } else {
      cudaLaunchAttribute attribute{};
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = CM;
      attribute.val.clusterDim.y = CN;
      attribute.val.clusterDim.z = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = grid;
      config.blockDim = block;
      config.dynamicSmemBytes = static_cast<size_t>(smem);
      config.stream = stream;
      config.attrs = &attribute;
      config.numAttrs = 1;
      RN_CUDA_CHECK(cudaLaunchKernelEx(&config, cutlass::device_kernel<Kernel>, params));
    }
    RN_CUDA_CHECK_LAUNCH();
  }

 private:
  typename Conv::Arguments arguments(const ConvProblem& p, const ConvOperands& operands,
                                     const EpilogueArgs& epilogue) const {
    const ProblemShape problem = conv_problem_shape<ProblemShape>(p);
    // y (and the residual) in the epilogue's ((Q, P, N), K, L) view of NHWC.
    typename Kernel::StrideC stride_c{};
    typename Kernel::StrideD stride_d{};
    const int64_t q = p.q(), pq = static_cast<int64_t>(p.p()) * p.q();
    cute::get<0, 0>(stride_c) = p.k;
    cute::get<0, 1>(stride_c) = q * p.k;
    cute::get<0, 2>(stride_c) = pq * p.k;
    cute::get<0, 0>(stride_d) = p.k;
    cute::get<0, 1>(stride_d) = q * p.k;
    cute::get<0, 2>(stride_d) = pq * p.k;
    typename Kernel::EpilogueArguments epi{
        {}, static_cast<const ElementC*>(epilogue.residual), stride_c, static_cast<Element*>(operands.y), stride_d};
    epi.thread = EpilogueTree::arguments(epilogue);
    return typename Conv::Arguments(
        problem, {static_cast<const Element*>(operands.x), static_cast<const Element*>(operands.w)}, epi, {});
  }

  KernelInfo info_;
};

}  // namespace rn::ownconv::sm90

// One kernel per translation unit: RN_OWNCONV_SM90(s8_res_128x64x64_s4, int8_t, RequantizeResidual, 128, 64, 64, 4)
// defines it (the last argument: mainloop stages, 0 for as many as fit) and registers it under that name.
#define RN_OWNCONV_SM90(NAME, ELEMENT, EPILOGUE, TM, TN, TK, STAGES) \
  RN_OWNCONV_REGISTER(NAME,                                          \
                      ::rn::ownconv::sm90::Sm90Conv<ELEMENT, ::rn::ownconv::Epilogue::EPILOGUE, TM, TN, TK, STAGES>)
