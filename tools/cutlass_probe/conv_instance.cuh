// One CUTLASS 3.x (4.x headers) sm90 implicit-GEMM fprop convolution with our fused epilogue, behind probe::ConvKernel.
//
// GEMM view of fprop: M = N*P*Q output pixels, N = K output channels, K = C*R*S. The mainloop loads activations
// with TMA im2col and filters with tiled TMA, one producer warp group feeding one wgmma consumer warp group
// (KernelImplicitTmaWarpSpecializedSm90: CUTLASS 4.2 has no persistent/cooperative schedule for conv).
//
// The epilogue is our own visitor tree (EVT), so it can grow (a companion issue wants batch-norm statistics):
//   no residual:   y = cvt(relu(alpha[k] * acc + bias[k]))
//   with residual: y = cvt(relu(beta * r + (alpha[k] * acc + bias[k])))
// alpha, bias: fp32 per output channel (a row broadcast in GEMM terms: one value per column n = k); beta: one fp32
// scalar; r: the residual tensor, read by the epilogue's TMA as source C (same dtype and layout as y); fp32 math
// (fused multiply-adds), cvt = round to nearest even with saturation (int8: cvt.rni.s32.f32 then cvt.pack.sat.s8).
#pragma once

#include "probe_api.h"

#include <cstdio>
#include <sstream>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/kernel_hardware_info.hpp"  // before the conv headers: sm100_implicit_gemm_umma_warpspecialized.hpp uses it undeclared
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/thread/activation.h"

namespace probe {

template <class T> struct ProbeDType;
template <> struct ProbeDType<int8_t> { static constexpr DType value = DType::S8; using Acc = int32_t; };
template <> struct ProbeDType<cutlass::half_t> { static constexpr DType value = DType::F16; using Acc = float; };

namespace evt {
using namespace cute;
using namespace cutlass::epilogue::fusion;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// alpha[k] * acc + bias[k]
template <class Tile>
using ScaleBias = Sm90EVT<Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,
                          Sm90RowBroadcast<0, Tile, float, float, Stride<_0, _1, int64_t>>,  // alpha[k]
                          Sm90AccFetch,
                          Sm90RowBroadcast<0, Tile, float, float, Stride<_0, _1, int64_t>>>;  // bias[k]

template <class Tile, class Out>
using NoResidual = Sm90EVT<Sm90Compute<cutlass::epilogue::thread::ReLu, Out, float, kRound>, ScaleBias<Tile>>;

template <class Tile, class Out>
using Residual = Sm90EVT<Sm90Compute<cutlass::epilogue::thread::ReLu, Out, float, kRound>,
                         Sm90EVT<Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,
                                 Sm90ScalarBroadcast<float>,  // beta
                                 Sm90SrcFetch<Out>,           // residual (source C)
                                 ScaleBias<Tile>>>;
}  // namespace evt

// The 2-D fprop problem of one probe shape (NHWC activations, KRSC filters, symmetric padding, no dilation).
template <class ProblemShape>
ProblemShape conv_problem(const ConvShape& s) {
  typename ProblemShape::TensorExtent act{s.n, s.h, s.w, s.c};
  typename ProblemShape::TensorExtent flt{s.k, s.r, s.s, s.c};
  typename ProblemShape::ShapePadding pad{s.pad, s.pad};
  typename ProblemShape::TraversalStride stride{s.stride, s.stride};
  typename ProblemShape::ShapeDilation dil{1, 1};
  return ProblemShape(cutlass::conv::Mode::kCrossCorrelation, act, flt, pad, pad, stride, dil, 1);
}

// The epilogue tree's arguments of one call: alpha and bias per output channel, and with a residual its scale.
template <class TileShape, bool WithResidual, class EpilogueArguments>
void set_epilogue_thread(EpilogueArguments& epi, const ConvCall& call) {
  typename evt::ScaleBias<TileShape>::Arguments scale_bias{{call.alpha, 0.f, {}}, {}, {call.bias, 0.f, {}}, {}};
  if constexpr (WithResidual) {
    epi.thread = {{{{call.beta}, {nullptr}, {}}, {}, scale_bias, {}}, {}};
  } else {
    epi.thread = {scale_bias, {}};
  }
}

// A CUTLASS 3.x device adapter (ConvUniversalAdapter, GemmUniversalAdapter) with the workspace it asks for:
// initialize() checks and prepares one call's arguments (an error string, empty on success), run() launches it.
template <class Adapter>
class AdapterRunner {
 public:
  AdapterRunner() = default;
  AdapterRunner(const AdapterRunner&) = delete;
  AdapterRunner& operator=(const AdapterRunner&) = delete;
  ~AdapterRunner() {
    if (workspace_) cudaFree(workspace_);
  }

  std::string initialize(typename Adapter::Arguments const& args, cudaStream_t stream) {
    cutlass::Status st = op_.can_implement(args);
    if (st != cutlass::Status::kSuccess) return std::string("can_implement: ") + cutlassGetStatusString(st);
    size_t ws = Adapter::get_workspace_size(args);
    if (ws > workspace_bytes_) {
      if (workspace_) cudaFree(workspace_);
      workspace_ = nullptr;
      workspace_bytes_ = 0;
      if (cudaMalloc(&workspace_, ws) != cudaSuccess) return "workspace allocation failed";
      workspace_bytes_ = ws;
    }
    st = op_.initialize(args, workspace_, stream);
    if (st != cutlass::Status::kSuccess) return std::string("initialize: ") + cutlassGetStatusString(st);
    return "";
  }

  cudaError_t run(cudaStream_t stream) {
    if (op_.run(stream) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
    return cudaGetLastError();
  }

 private:
  Adapter op_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// Stages: 0 = as many mainloop stages as fit in shared memory beside the epilogue (CUTLASS's auto carveout: then one
// CTA per SM), else that many (fewer stages leave room for two or more CTAs per SM, so one CTA's epilogue overlaps
// another's mainloop: the non-persistent schedule's only overlap).
template <class Element, bool WithResidual, int TM, int TN, int TK, int CM, int CN, int Stages = 0>
class ConvInstance final : public ConvKernel {
 public:
  using Acc = typename ProbeDType<Element>::Acc;
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Shape<cute::Int<TK>>>;
  using ClusterShape = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;
  using ElementC = std::conditional_t<WithResidual, Element, void>;
  static constexpr int kAlign = 16 / sizeof(Element);
  using Fusion = std::conditional_t<WithResidual, evt::Residual<TileShape, Element>, evt::NoResidual<TileShape, Element>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Acc, float,
      ElementC, cutlass::layout::TensorNHWC, kAlign,
      Element, cutlass::layout::TensorNHWC, kAlign,
      cutlass::epilogue::TmaWarpSpecialized, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
      Element, cutlass::layout::TensorNHWC, kAlign,
      Element, cutlass::layout::TensorNHWC, kAlign,
      Acc, TileShape, ClusterShape,
      std::conditional_t<Stages == 0,
                         cutlass::conv::collective::StageCountAutoCarveout<
                             static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
                         cutlass::conv::collective::StageCount<(Stages > 0 ? Stages : 1)>>,
      cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;

  using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

  explicit ConvInstance(const char* name) : name_(name) {}

  std::string name() const override { return name_; }
  DType dtype() const override { return ProbeDType<Element>::value; }
  bool has_residual() const override { return WithResidual; }
  std::string describe() const override {
    std::ostringstream o;
    o << "\"tile\":[" << TM << "," << TN << "," << TK << "],\"cluster\":[" << CM << "," << CN << ",1]"
      << ",\"stages\":" << CollectiveMainloop::DispatchPolicy::Stages
      << ",\"smem_bytes\":" << int(Kernel::SharedStorageSize) << ",\"threads\":" << int(Kernel::MaxThreadsPerBlock);
    // Resident CTAs per SM (cluster limits aside), once the kernel may use that much dynamic shared memory.
    int ctas = -1;
    if (cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(Kernel::SharedStorageSize)) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, cutlass::device_kernel<Kernel>,
                                                      int(Kernel::MaxThreadsPerBlock),
                                                      int(Kernel::SharedStorageSize)) != cudaSuccess)
      ctas = -1;
    cudaGetLastError();
    o << ",\"ctas_per_sm\":" << ctas;
    return o.str();
  }

  std::string prepare(const ConvShape& s, const ConvCall& call, cudaStream_t stream) override {
    if ((call.residual != nullptr) != WithResidual) return "residual input does not match the instantiation";
    using namespace cute;
    const ProblemShape problem = conv_problem<ProblemShape>(s);

    // Output (and residual) strides in the epilogue's ((Q,P,N), K, L) view of NHWC.
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    StrideC dC{};
    StrideD dD{};
    const int64_t q = s.q(), p = s.p();
    get<0, 0>(dC) = s.k; get<0, 1>(dC) = q * s.k; get<0, 2>(dC) = p * q * s.k;
    get<0, 0>(dD) = s.k; get<0, 1>(dD) = q * s.k; get<0, 2>(dD) = p * q * s.k;

    cutlass::KernelHardwareInfo hw;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);

    typename Kernel::EpilogueArguments epi{{}, static_cast<const ElementC*>(call.residual), dC,
                                           static_cast<Element*>(call.y), dD};
    set_epilogue_thread<TileShape, WithResidual>(epi, call);
    typename Conv::Arguments args(problem,
                                  {static_cast<const Element*>(call.x), static_cast<const Element*>(call.w)},
                                  epi, hw);
    return runner_.initialize(args, stream);
  }

  cudaError_t launch(cudaStream_t stream) override { return runner_.run(stream); }

 private:
  std::string name_;
  AdapterRunner<Conv> runner_;
};

}  // namespace probe

// One instantiation per translation unit: PROBE_INSTANCE(s8_res_128x128x128_1x1, int8_t, true, 128, 128, 128, 1, 1, 0)
// defines probe::make_<name>() (the last argument: mainloop stages, 0 = auto).
#define PROBE_INSTANCE(NAME, ELEMENT, RESIDUAL, TM, TN, TK, CM, CN, STAGES)                                   \
  namespace probe {                                                                                            \
  std::unique_ptr<ConvKernel> make_##NAME() {                                                                  \
    return std::unique_ptr<ConvKernel>(                                                                        \
        new ConvInstance<ELEMENT, RESIDUAL, TM, TN, TK, CM, CN, STAGES>(#NAME));                              \
  }                                                                                                            \
  }
