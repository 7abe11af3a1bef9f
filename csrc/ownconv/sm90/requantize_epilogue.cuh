// The 8-bit requantising epilogues (own_conv.h's Epilogue) as CUTLASS epilogue visitor trees (EVT), and how
// EpilogueArgs fill their arguments. A tree runs per accumulator fragment in registers, between the wgmma
// mainloop and the TMA store: the fusion costs no pass over memory. A later epilogue (batch-norm statistics beside
// the store) is another tree in its own header, selected by its Epilogue value in conv_sm90.cuh.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/functional.h"

#include "../own_conv.h"

namespace rn::ownconv::sm90 {

namespace evt {
using namespace cute;
using namespace cutlass::epilogue::fusion;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// One fp32 value per output channel: a row broadcast in GEMM terms (a row is the K output channels).
template <class Tile>
using PerChannel = Sm90RowBroadcast<0, Tile, float, float, Stride<_0, _1, int64_t>>;

// alpha[k] * acc + bias[k]: one fused multiply-add (the accumulator converted to fp32 first, round to nearest).
template <class Tile>
using ScaleBias = Sm90EVT<Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>, PerChannel<Tile>,
                          Sm90AccFetch, PerChannel<Tile>>;

// Clamp to [lower, 127] (runtime bounds: lower 0 is the ReLU), then the conversion to Out: round to nearest even,
// saturating.
template <class Out, class Child>
using ClampTo = Sm90EVT<Sm90Compute<cutlass::epilogue::thread::Clamp, Out, float, kRound>, Child>;

template <class Tile, class Out>
using Requantize = ClampTo<Out, ScaleBias<Tile>>;

// beta * r + (alpha[k] * acc + bias[k]): the residual r is CUTLASS's source tensor C, loaded by the epilogue's TMA.
template <class Tile, class Out>
using RequantizeResidual = ClampTo<Out, Sm90EVT<Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,
                                                Sm90ScalarBroadcast<float>, Sm90SrcFetch<Out>, ScaleBias<Tile>>>;
}  // namespace evt

// The tree of one Epilogue for a tile shape and output type: Fusion, ElementC (the source tensor's element, void
// without one) and the tree's arguments from EpilogueArgs.
template <Epilogue E, class Tile, class Out>
struct RequantizeEpilogue;

// alpha[k] * acc + bias[k]'s arguments, and the clamp's: [lower, 127].
template <class Tile>
typename evt::ScaleBias<Tile>::Arguments scale_bias_arguments(const EpilogueArgs& e) {
  return {{e.alpha, 0.f, {}}, {}, {e.bias, 0.f, {}}, {}};
}
inline cutlass::epilogue::thread::Clamp<float>::Arguments clamp_arguments(const EpilogueArgs& e) {
  return {e.lower, 127.f};
}

template <class Tile, class Out>
struct RequantizeEpilogue<Epilogue::Requantize, Tile, Out> {
  using Fusion = evt::Requantize<Tile, Out>;
  using ElementC = void;
  static typename Fusion::Arguments arguments(const EpilogueArgs& e) {
    return {scale_bias_arguments<Tile>(e), clamp_arguments(e)};
  }
};

template <class Tile, class Out>
struct RequantizeEpilogue<Epilogue::RequantizeResidual, Tile, Out> {
  using Fusion = evt::RequantizeResidual<Tile, Out>;
  using ElementC = Out;
  static typename Fusion::Arguments arguments(const EpilogueArgs& e) {
    return {{{{e.beta}, {nullptr}, {}}, {}, scale_bias_arguments<Tile>(e), {}}, clamp_arguments(e)};
  }
};

}  // namespace rn::ownconv::sm90
