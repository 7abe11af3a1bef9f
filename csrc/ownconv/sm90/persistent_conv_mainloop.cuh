// CUTLASS 4.2's sm90 conv collective (TMA im2col loads, wgmma) under one of its persistent GEMM kernels
// (persistent_schedule.cuh), where a fixed grid of CTAs walks the output tiles and the producer loads the next tile
// during an epilogue.
// CUTLASS's ConvUniversal runs the collective only under the non-persistent kernel (its persistent conv schedules
// are refused), where a tile's epilogue stalls its mainloop.
//
// The GEMM kernel asks two things of a mainloop that the conv collective does not do, and ConvMainloopAdapter
// supplies them:
//   - its problem shape is an (M, N, K, L) tuple, while the collective builds its im2col TMA descriptor from the
//     ConvProblemShape: the adapter's Arguments carry the ConvProblemShape beside the pointers, and the kernel's
//     MNKL is (N*P*Q, K, (C, S, R), 1), the collective's own linearised shape, so the scheduler's k-tile count
//     (ceil(C/TK)*S*R) is the collective's k loop;
//   - it indexes a batch mode (L) of the tiled operands, which the collective's tensors lack: load_init appends a
//     unit L mode and load drops it before the collective's load.
// Only CUTLASS types here (the probe in tools/cutlass_probe builds on the same header).
#pragma once

#include <type_traits>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/collective/detail.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

#include "persistent_schedule.cuh"

namespace rn::ownconv::sm90 {

// GemmUniversal dispatches on these to its cooperative and ping-pong kernels; the conv dispatch policy accepts them
// (it rejects only CUTLASS's own conv cooperative / ping-pong tags).
struct KernelConvPersistentCooperative : GemmKernelSchedule<PersistentSchedule::Cooperative> {};
struct KernelConvPersistentPingpong : GemmKernelSchedule<PersistentSchedule::Pingpong> {};

template <class Base>
struct ConvMainloopAdapter : Base {
  using ConvProblemShape = typename Base::ProblemShape;
  using Params = typename Base::Params;
  // What the GEMM kernel asks of a mainloop and the conv collective does not say: its TMA producer's arrivals per
  // stage, and rank-3 (M|N, K, L) strides (only checked: the collective keeps its own for its descriptors).
  static constexpr int NumProducerThreadEvents = 1;
  using StrideA = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideB = cute::Stride<int64_t, cute::_1, int64_t>;
  struct Arguments : Base::Arguments {
    ConvProblemShape conv{};
  };

  template <class ProblemShapeMNKL>
  static constexpr Params to_underlying_arguments(ProblemShapeMNKL const&, Arguments const& args, void* workspace) {
    return Base::to_underlying_arguments(args.conv, args, workspace);
  }

  template <class ProblemShapeMNKL>
  static bool can_implement(ProblemShapeMNKL const&, Arguments const& args) {
    return Base::can_implement(args.conv, args);
  }

  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& problem_shape_MNKL, Params const& params) {
    auto inputs = Base::load_init(problem_shape_MNKL, params);
    return cute::make_tuple(with_unit_l(cute::get<0>(inputs)), with_unit_l(cute::get<1>(inputs)));
  }

  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState state, cute::tuple<TensorA, TensorB> const& inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                           uint32_t block_rank_in_cluster, typename Base::TensorStorage& shared_tensors) {
    using cute::_;
    auto tiled = cute::make_tuple(cute::get<0>(inputs)(_, _, _, _, 0), cute::get<1>(inputs)(_, _, _, _, 0));
    Base::load(params, pipeline, state, tiled, blk_coord, k_tile_iter, k_tile_count, thread_idx, block_rank_in_cluster,
               shared_tensors);
  }

 private:
  // t with a trailing mode of extent 1: on the outer layout of a composed (im2col) one.
  template <class Tensor>
  CUTLASS_DEVICE static auto with_unit_l(Tensor const& t) {
    auto unit = cute::make_layout(cute::_1{}, cute::_0{});
    auto const& layout = t.layout();
    if constexpr (cute::is_composed_layout<cute::remove_cvref_t<decltype(layout)>>::value) {
      return cute::make_tensor(t.data(), cute::make_composed_layout(layout.layout_a(), layout.offset(),
                                                                    cute::append(layout.layout_b(), unit)));
    } else {
      return cute::make_tensor(t.data(), cute::append(layout, unit));
    }
  }
};

// The conv collective of CUTLASS's sm90 builder under a persistent schedule, no cluster: cooperative splits a tile's
// rows over two consumer warp groups (an MMA atom layout of 2x1x1), ping-pong gives each the whole tile. TileShape's K
// mode is a one-mode shape: the collective tiles (C, S, R) by it. Stages 0: as many as fit beside the epilogue's shared
// memory and 1 KB of the scheduler's and pipelines' barriers (one CTA per SM, which a persistent kernel wants).
template <class Element, class Accumulator, int TM, int TN, int TK, PersistentSchedule Schedule, int Stages,
          int EpilogueSmemBytes>
struct PersistentConvMainloop {
  static constexpr bool kCooperative = Schedule == PersistentSchedule::Cooperative;
  using KernelSchedule =
      std::conditional_t<kCooperative, KernelConvPersistentCooperative, KernelConvPersistentPingpong>;
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Shape<cute::Int<TK>>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static constexpr cute::GMMA::Major kMajor = cute::GMMA::Major::K;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, Accumulator, TileShape, kMajor, kMajor>(),
      cute::Layout<cute::Shape<cute::Int<kCooperative ? 2 : 1>, cute::_1, cute::_1>>{}));
  using CopyA = decltype(cutlass::conv::collective::detail::sm90_cluster_shape_to_im2col_tma_atom(
      cute::shape<1>(ClusterShape{})));
  using CopyB =
      decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(cute::shape<0>(ClusterShape{})));
  using AtomA =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<kMajor, Element, decltype(cute::get<0>(TileShape{})),
                                                                   decltype(cute::get<2>(TileShape{}))>());
  using AtomB =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<kMajor, Element, decltype(cute::get<1>(TileShape{})),
                                                                   decltype(cute::get<2>(TileShape{}))>());
  static constexpr int kStages =
      Stages > 0 ? Stages
                 : cutlass::conv::collective::detail::compute_stage_count_or_override<
                       cutlass::gemm::collective::detail::sm90_smem_capacity_bytes, Element, Element, TileShape>(
                       cutlass::conv::collective::StageCountAutoCarveout<EpilogueSmemBytes + 1024>{});
  using SmemLayoutA = decltype(cute::tile_to_shape(
      AtomA{}, cute::make_shape(cute::shape<0>(TileShape{}), cute::shape<2>(TileShape{}), cute::Int<kStages>{}),
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      AtomB{}, cute::make_shape(cute::shape<1>(TileShape{}), cute::shape<2>(TileShape{}), cute::Int<kStages>{}),
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using Policy = cutlass::conv::MainloopSm90TmaGmmaWarpSpecializedImplicitGemm<cutlass::conv::Operator::kFprop, kStages,
                                                                               2, ClusterShape, KernelSchedule>;
  using Base = cutlass::conv::collective::CollectiveConv<
      Policy, TileShape, Element, Element, TiledMma,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<CopyA, SmemLayoutA>,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<CopyB, SmemLayoutB>>;
  using Collective = ConvMainloopAdapter<Base>;
};

}  // namespace rn::ownconv::sm90
