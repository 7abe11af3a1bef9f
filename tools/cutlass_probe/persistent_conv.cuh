// A persistent, cooperative sm90 implicit-GEMM fprop convolution: CUTLASS 4.2's conv collective (TMA im2col loads,
// wgmma) run by its cooperative GEMM kernel (a fixed grid of CTAs walking the output tiles, two consumer warp groups
// per tile, the producer loading the next tile during the epilogue), with our EVT epilogue on the output as the
// (N*P*Q, K) row-major matrix it is in NHWC.
//
// CUTLASS 4.2 refuses its own cooperative conv schedule ("Persistent schedules not support for conv yet"): its
// ConvUniversal is GemmUniversal's non-persistent kernel with the conv collective. The cooperative kernel lacks
// two things for a conv collective, which ConvMainloopAdapter supplies:
//   - its problem shape is an (M, N, K, L) tuple, while the collective builds its im2col TMA descriptor from the
//     ConvProblemShape: the adapter's Arguments carry the ConvProblemShape beside the pointers; the kernel's MNKL is
//     (N*P*Q, K, (C, S, R), 1), the collective's own linearised shape, so the scheduler's k-tile count
//     (ceil(C/TK)*S*R) matches the collective's k loop;
//   - it indexes a batch mode (L) of the tiled operands, which the conv collective's tiled tensors do not have: the
//     adapter's load_init appends a unit L mode, and its load drops it again before the collective's load.
// A prototype for the probe: checked against the host reference and timed by run_on_gpu.sh like the others.
#pragma once

#include "conv_instance.cuh"

#include "cutlass/conv/collective/detail.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace probe {

// GemmUniversal dispatches on this to its cooperative kernel; the conv dispatch policy accepts it (it rejects only
// CUTLASS's own conv cooperative / ping-pong tags).
struct KernelConvPersistentCooperative : cutlass::gemm::KernelTmaWarpSpecializedCooperative {};

template <class Base>
struct ConvMainloopAdapter : Base {
  using ConvProblemShape = typename Base::ProblemShape;
  using Params = typename Base::Params;
  // What the GEMM kernel asks of a mainloop and the conv collective does not say: its TMA producer's arrivals per
  // stage, and rank-3 (M|N, K, L) strides (only checked: the conv collective keeps its own for its descriptors).
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

// The conv collective of CUTLASS's sm90 builder, with two consumer warp groups (an MMA atom layout of 2x1x1) and
// the persistent schedule. TileShape's K mode is a one-mode shape, as the conv collective tiles (C, S, R) by it.
template <class Element, class Acc, int TM, int TN, int TK, int Stages, int EpilogueSmemBytes>
struct PersistentConvMainloop {
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Shape<cute::Int<TK>>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static constexpr cute::GMMA::Major kMajor = cute::GMMA::Major::K;
  using TiledMma =
      decltype(cute::make_tiled_mma(cute::GMMA::ss_op_selector<Element, Element, Acc, TileShape, kMajor, kMajor>(),
                                    cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
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
  // Stages: 0 = as many as fit beside the epilogue's shared memory and 1 KB for the scheduler's and the pipelines'
  // barriers (one CTA per SM, which a persistent kernel wants).
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
  using Policy =
      cutlass::conv::MainloopSm90TmaGmmaWarpSpecializedImplicitGemm<cutlass::conv::Operator::kFprop, kStages, 2,
                                                                    ClusterShape, KernelConvPersistentCooperative>;
  using Base = cutlass::conv::collective::CollectiveConv<
      Policy, TileShape, Element, Element, TiledMma,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<CopyA, SmemLayoutA>,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<CopyB, SmemLayoutB>>;
  using Collective = ConvMainloopAdapter<Base>;
};

template <class Element, bool WithResidual, int TM, int TN, int TK, int Stages = 0>
class PersistentConvInstance final : public ConvKernel {
 public:
  using Acc = typename ProbeDType<Element>::Acc;
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Shape<cute::Int<TK>>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using ElementC = std::conditional_t<WithResidual, Element, void>;
  static constexpr int kAlign = 16 / sizeof(Element);
  using Fusion =
      std::conditional_t<WithResidual, evt::Residual<TileShape, Element>, evt::NoResidual<TileShape, Element>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Acc, float, ElementC, cutlass::layout::RowMajor, kAlign, Element,
      cutlass::layout::RowMajor, kAlign, cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;
  using CollectiveMainloop =
      typename PersistentConvMainloop<Element, Acc, TM, TN, TK, Stages,
                                      static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>::Collective;
  // (M, N, K, L) = (N*P*Q, K, (C, S, R), 1): the conv collective's linearised fprop shape.
  using ProblemShape = cute::Shape<int, int, cute::Shape<int, int, int>, int>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  explicit PersistentConvInstance(const char* name) : name_(name) {}

  std::string name() const override { return name_; }
  DType dtype() const override { return ProbeDType<Element>::value; }
  bool has_residual() const override { return WithResidual; }
  std::string describe() const override {
    std::ostringstream o;
    o << "\"tile\":[" << TM << "," << TN << "," << TK << "],\"cluster\":[1,1,1],\"persistent\":true"
      << ",\"stages\":" << CollectiveMainloop::DispatchPolicy::Stages
      << ",\"smem_bytes\":" << int(Kernel::SharedStorageSize) << ",\"threads\":" << int(Kernel::MaxThreadsPerBlock);
    return o.str();
  }

  std::string prepare(const ConvShape& s, const ConvCall& call, cudaStream_t stream) override {
    if ((call.residual != nullptr) != WithResidual) return "residual input does not match the instantiation";
    const auto conv = conv_problem<typename CollectiveMainloop::ConvProblemShape>(s);

    const int m = s.n * s.p() * s.q();
    ProblemShape mnkl{m, s.k, cute::make_shape(s.c, s.s, s.r), 1};
    auto dC = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, {m, s.k, 1});
    auto dD = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {m, s.k, 1});

    cutlass::KernelHardwareInfo hw;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);

    typename Kernel::EpilogueArguments epi{
        {}, static_cast<const ElementC*>(call.residual), dC, static_cast<Element*>(call.y), dD};
    set_epilogue_thread<TileShape, WithResidual>(epi, call);
    typename CollectiveMainloop::Arguments mainloop{};
    mainloop.ptr_A = static_cast<const Element*>(call.x);
    mainloop.ptr_B = static_cast<const Element*>(call.w);
    mainloop.conv = conv;
    return runner_.initialize({cutlass::gemm::GemmUniversalMode::kGemm, mnkl, mainloop, epi, hw}, stream);
  }

  cudaError_t launch(cudaStream_t stream) override { return runner_.run(stream); }

 private:
  std::string name_;
  AdapterRunner<Gemm> runner_;
};

}  // namespace probe

// PROBE_PERSISTENT_INSTANCE(s8_p_128x128x64, int8_t, false, 128, 128, 64, 0) defines probe::make_<name>() (the last
// argument: mainloop stages, 0 = as many as fit).
#define PROBE_PERSISTENT_INSTANCE(NAME, ELEMENT, RESIDUAL, TM, TN, TK, STAGES)                                    \
  namespace probe {                                                                                               \
  std::unique_ptr<ConvKernel> make_##NAME() {                                                                     \
    return std::unique_ptr<ConvKernel>(new PersistentConvInstance<ELEMENT, RESIDUAL, TM, TN, TK, STAGES>(#NAME)); \
  }                                                                                                               \
  }
