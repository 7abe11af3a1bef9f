// A 1x1, stride-1, unpadded forward convolution as the plain GEMM it is on NHWC data: y (N*H*W, K) = x (N*H*W, C)
// times w (K, C) transposed, both operands K-major (the int8 wgmma's layout), under one of CUTLASS's persistent
// GEMM schedules (persistent_schedule.cuh): a fixed grid of CTAs walks the output tiles while the producer loads the
// next, so one tile's epilogue overlaps the next tile's loads. That overlap is what a 1x1 layer with few input
// channels needs (one or two k-steps a tile, an epilogue as long as its mainloop, longer with a residual). The epilogue
// is the same visitor tree as the convolutions' (requantize_epilogue.cuh).
//
// A residual layer streams three tensors and does almost no math: the epilogue's loads of the residual (C) must run
// far enough ahead to hide memory latency. CUTLASS's builder gives C at most four buffers of one epilogue sub-tile;
// EPI_N and STAGES_C (0: the builder's choice) set the sub-tile's width and that depth.
//
// Adding a kernel: a new .cu file here with one RN_OWNCONV_SM90_GEMM1X1(...) line (see the existing ones).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "../../core/error.h"
#include "../../core/launch_config.h"
#include "../registry.h"
#include "kernel_common.cuh"
#include "persistent_schedule.cuh"
#include "requantize_epilogue.cuh"

namespace rn::ownconv::sm90 {

// The collective epilogue: CUTLASS's builder's, or (StagesC > 0) the same collective with EpiN-wide sub-tiles (64
// rows for ping-pong, whose warp groups each own a tile; 128 for cooperative) and StagesC buffers for the source C.
template <class TileShape, class Tree, PersistentSchedule Schedule, int EpiN, int StagesC, int Alignment,
          bool Custom = (StagesC > 0)>
struct Gemm1x1Epilogue {
  using CollectiveOp = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, cute::Shape<cute::_1, cute::_1, cute::_1>,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, typename Tree::ElementC,
      cutlass::layout::RowMajor, Alignment, int8_t, cutlass::layout::RowMajor, Alignment, EpilogueSchedule<Schedule>,
      typename Tree::Fusion>::CollectiveOp;
};

template <class TileShape, class Tree, PersistentSchedule Schedule, int EpiN, int StagesC, int Alignment>
struct Gemm1x1Epilogue<TileShape, Tree, Schedule, EpiN, StagesC, Alignment, true> {
  static constexpr bool kCooperative = Schedule == PersistentSchedule::Cooperative;
  static constexpr int kRows = kCooperative ? 128 : 64;
  using EpilogueTile = cute::Shape<cute::Int<kRows>, cute::Int<EpiN>>;
  static constexpr int kFragment = kRows * EpiN / (kCooperative ? 256 : 128);  // one thread's share of a sub-tile
  // As the builder: stores not delayed behind a residual's loads.
  using Policy =
      cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, 2, kFragment, false, std::is_void_v<typename Tree::ElementC>>;
  using CollectiveOp = typename cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<
      TileShape, EpilogueTile, int32_t, float, typename Tree::ElementC, cutlass::layout::RowMajor, Alignment, int8_t,
      cutlass::layout::RowMajor, Alignment, typename Tree::Fusion, Policy>::CollectiveOp;
};

template <Epilogue E, PersistentSchedule Schedule, int TM, int TN, int TK, int EpiN = 0, int StagesC = 0>
class Sm90Gemm1x1 final : public GemmUniversalConv<Sm90Gemm1x1<E, Schedule, TM, TN, TK, EpiN, StagesC>> {
 public:
  using Element = int8_t;
  using Accumulator = int32_t;
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using EpilogueTree = RequantizeEpilogue<E, TileShape, Element>;
  using ElementC = typename EpilogueTree::ElementC;
  static constexpr int kAlignment = 16;  // int8 elements per 16 bytes: TMA's unit

  using CollectiveEpilogue =
      typename Gemm1x1Epilogue<TileShape, EpilogueTree, Schedule, EpiN, StagesC, kAlignment>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlignment, Element,
      cutlass::layout::ColumnMajor, kAlignment, Accumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      GemmKernelSchedule<Schedule>>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  explicit Sm90Gemm1x1(const char* name)
      : info_(int8_kernel_info<Kernel, CollectiveMainloop>(name, E, TM, TN, TK, kAlignment)) {
    info_.persistent = true;
    info_.gemm_1x1 = true;
  }

  const KernelInfo& info() const override { return info_; }

  std::string unsupported(const ConvProblem& p) const override {
    if (p.r != 1 || p.s != 1 || p.stride_h != 1 || p.stride_w != 1 || p.pad_h != 0 || p.pad_w != 0) {
      return "a 1x1 GEMM: takes 1x1 filters at stride 1 without padding only";
    }
    if (p.c % kAlignment != 0 || p.k % kAlignment != 0) {
      return "C=" + std::to_string(p.c) + " and K=" + std::to_string(p.k) + " must be multiples of " +
             std::to_string(kAlignment) + " (TMA moves 16-byte rows of channels)";
    }
    if (int64_t{p.n} * p.h * p.w > INT32_MAX) return "N*H*W over 2^31 - 1 (the GEMM's M is an int)";
    if (Gemm::can_implement(arguments(p, {}, {}, {0, 1})) != cutlass::Status::kSuccess) {
      return "CUTLASS cannot run this problem";
    }
    return "";
  }

  // Gemm::Arguments of one call (GemmUniversalConv launches it).
  typename Gemm::Arguments arguments(const ConvProblem& p, const ConvOperands& operands, const EpilogueArgs& epilogue,
                                     const cutlass::KernelHardwareInfo& hw) const {
    const int m = p.n * p.h * p.w;
    typename Kernel::StrideA stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {m, p.c, 1});
    typename Kernel::StrideB stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {p.k, p.c, 1});
    typename Kernel::StrideC stride_c = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, {m, p.k, 1});
    typename Kernel::StrideD stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {m, p.k, 1});
    typename Kernel::EpilogueArguments epi{
        {}, static_cast<const ElementC*>(epilogue.residual), stride_c, static_cast<Element*>(operands.y), stride_d};
    epi.thread = EpilogueTree::arguments(epilogue);
    return typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, p.k, p.c, 1},
        {static_cast<const Element*>(operands.x), stride_a, static_cast<const Element*>(operands.w), stride_b},
        epi,
        hw};
  }

 private:
  KernelInfo info_;
};

}  // namespace rn::ownconv::sm90

// One kernel per translation unit: RN_OWNCONV_SM90_GEMM1X1(s8_1x1_res_128x128x64, RequantizeResidual, Cooperative,
// 128, 128, 64) defines it and registers it under that name; RN_OWNCONV_SM90_GEMM1X1_EPI adds EPI_N and STAGES_C.
#define RN_OWNCONV_SM90_GEMM1X1_EPI(NAME, EPILOGUE, SCHEDULE, TM, TN, TK, EPI_N, STAGES_C)                          \
  RN_OWNCONV_REGISTER(NAME, ::rn::ownconv::sm90::Sm90Gemm1x1<::rn::ownconv::Epilogue::EPILOGUE,                     \
                                                             ::rn::ownconv::sm90::PersistentSchedule::SCHEDULE, TM, \
                                                             TN, TK, EPI_N, STAGES_C>)
#define RN_OWNCONV_SM90_GEMM1X1(NAME, EPILOGUE, SCHEDULE, TM, TN, TK) \
  RN_OWNCONV_SM90_GEMM1X1_EPI(NAME, EPILOGUE, SCHEDULE, TM, TN, TK, 0, 0)
