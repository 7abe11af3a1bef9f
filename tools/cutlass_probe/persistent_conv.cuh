// A persistent sm90 implicit-GEMM fprop convolution for the probe: the package's own mainloop
// (csrc/ownconv/sm90/persistent_conv_mainloop.cuh: CUTLASS's conv collective under its cooperative or ping-pong GEMM
// kernel) with the probe's EVT epilogue on the output as the (N*P*Q, K) row-major matrix it is in NHWC. Checked
// against the host reference and timed by run_on_gpu.sh like the others.
#pragma once

#include "conv_instance.cuh"

#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "../../csrc/ownconv/sm90/persistent_conv_mainloop.cuh"

namespace probe {

using rn::ownconv::sm90::PersistentConvMainloop;
using rn::ownconv::sm90::PersistentSchedule;

template <class Element, bool WithResidual, PersistentSchedule Schedule, int TM, int TN, int TK, int Stages = 0>
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
      cutlass::layout::RowMajor, kAlign,
      rn::ownconv::sm90::EpilogueSchedule<Schedule>, Fusion>::CollectiveOp;
  using CollectiveMainloop =
      typename PersistentConvMainloop<Element, Acc, TM, TN, TK, Schedule, Stages,
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
    o << "\"tile\":[" << TM << "," << TN << "," << TK << "],\"cluster\":[1,1,1],\"persistent\":\"" << (Schedule == PersistentSchedule::Cooperative ? "cooperative" : "pingpong") << "\""
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

// PROBE_PERSISTENT_INSTANCE(s8_p_128x128x64, int8_t, false, Cooperative, 128, 128, 64, 0) defines
// probe::make_<name>() (the last argument: mainloop stages, 0 = as many as fit).
#define PROBE_PERSISTENT_INSTANCE(NAME, ELEMENT, RESIDUAL, SCHEDULE, TM, TN, TK, STAGES)                  \
  namespace probe {                                                                                       \
  std::unique_ptr<ConvKernel> make_##NAME() {                                                             \
    return std::unique_ptr<ConvKernel>(                                                                   \
        new PersistentConvInstance<ELEMENT, RESIDUAL, PersistentSchedule::SCHEDULE, TM, TN, TK, STAGES>(#NAME)); \
  }                                                                                                       \
  }
