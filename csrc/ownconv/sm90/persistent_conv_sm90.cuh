// One persistent sm90 implicit-GEMM forward convolution behind ownconv::ConvKernel: CUTLASS's conv collective under
// its cooperative or ping-pong GEMM kernel (persistent_conv_mainloop.cuh), so one tile's epilogue overlaps the next
// tile's loads, with our requantising visitor tree (requantize_epilogue.cuh) on the output as the
// (N*P*Q, K) row-major matrix it is in NHWC. Same operands, limits and epilogue as conv_sm90.cuh's kernels.
//
// Adding a kernel: a new .cu file here with one RN_OWNCONV_SM90_PERSISTENT(...) line (see the existing ones).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "../../core/error.h"
#include "../../core/launch_config.h"
#include "../registry.h"
#include "kernel_common.cuh"
#include "persistent_conv_mainloop.cuh"
#include "requantize_epilogue.cuh"

namespace rn::ownconv::sm90 {

template <Epilogue E, PersistentSchedule Schedule, int TM, int TN, int TK>
class Sm90PersistentConv final : public GemmUniversalConv<Sm90PersistentConv<E, Schedule, TM, TN, TK>> {
 public:
  using Element = int8_t;
  using Accumulator = int32_t;
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Shape<cute::Int<TK>>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using EpilogueTree = RequantizeEpilogue<E, TileShape, Element>;
  using ElementC = typename EpilogueTree::ElementC;
  static constexpr int kAlignment = 16;  // int8 elements per 16 bytes: TMA's unit

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, float, ElementC, cutlass::layout::RowMajor,
      kAlignment, Element, cutlass::layout::RowMajor, kAlignment, EpilogueSchedule<Schedule>,
      typename EpilogueTree::Fusion>::CollectiveOp;
  using CollectiveMainloop =
      typename PersistentConvMainloop<Element, Accumulator, TM, TN, TK, Schedule, 0,
                                      static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>::Collective;
  // (M, N, K, L) = (N*P*Q, K, (C, S, R), 1): the conv collective's linearised fprop shape.
  using ProblemShape = cute::Shape<int, int, cute::Shape<int, int, int>, int>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  explicit Sm90PersistentConv(const char* name)
      : info_(int8_kernel_info<Kernel, CollectiveMainloop>(name, E, TM, TN, TK, kAlignment)) {
    info_.persistent = true;
  }

  const KernelInfo& info() const override { return info_; }

  std::string unsupported(const ConvProblem& p) const override {
    if (p.c % kAlignment != 0 || p.k % kAlignment != 0) {
      return "C=" + std::to_string(p.c) + " and K=" + std::to_string(p.k) + " must be multiples of " +
             std::to_string(kAlignment) + " (TMA moves 16-byte rows of channels)";
    }
    if (int64_t{p.n} * p.p() * p.q() > INT32_MAX) return "N*P*Q over 2^31 - 1 (the GEMM's M is an int)";
    if (Gemm::can_implement(arguments(p, {}, {}, {0, 1})) != cutlass::Status::kSuccess) {
      return "outside TMA im2col's limits (padding up to 256, filter extents up to 255, the im2col corners)";
    }
    return "";
  }

  // Gemm::Arguments of one call (GemmUniversalConv launches it).
  typename Gemm::Arguments arguments(const ConvProblem& p, const ConvOperands& operands, const EpilogueArgs& epilogue,
                                     const cutlass::KernelHardwareInfo& hw) const {
    const int m = p.n * p.p() * p.q();
    typename Kernel::StrideC stride_c = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, {m, p.k, 1});
    typename Kernel::StrideD stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {m, p.k, 1});
    typename Kernel::EpilogueArguments epi{
        {}, static_cast<const ElementC*>(epilogue.residual), stride_c, static_cast<Element*>(operands.y), stride_d};
    epi.thread = EpilogueTree::arguments(epilogue);
    typename CollectiveMainloop::Arguments mainloop{};
    mainloop.ptr_A = static_cast<const Element*>(operands.x);
    mainloop.ptr_B = static_cast<const Element*>(operands.w);
    mainloop.conv = conv_problem_shape<typename CollectiveMainloop::ConvProblemShape>(p);
    return typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm, {m, p.k, cute::make_shape(p.c, p.s, p.r), 1}, mainloop, epi, hw};
  }

 private:
  KernelInfo info_;
};

}  // namespace rn::ownconv::sm90

// One kernel per translation unit: RN_OWNCONV_SM90_PERSISTENT(s8_p_res_128x128x128, RequantizeResidual, Cooperative,
// 128, 128, 128) defines it and registers it under that name.
#define RN_OWNCONV_SM90_PERSISTENT(NAME, EPILOGUE, SCHEDULE, TM, TN, TK)               \
  RN_OWNCONV_REGISTER(                                                                 \
      NAME, ::rn::ownconv::sm90::Sm90PersistentConv<::rn::ownconv::Epilogue::EPILOGUE, \
                                                    ::rn::ownconv::sm90::PersistentSchedule::SCHEDULE, TM, TN, TK>)
