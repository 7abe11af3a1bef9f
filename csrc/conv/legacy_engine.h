// The legacy (cudnnConvolution*) convolution engine: forward, backward-data and backward-filter of 2-D
// convolutions with any stride/pad/dilation/groups in NCHW or NHWC, fp32 (strict FMA) / TF32 / fp16 / bf16
// with fp32 accumulation, plus the fused forward epilogue of cudnnConvolutionBiasActivationForward.
// Same shape as the graph engine (graph/graph_engine.h): choose() decides, run() executes; conv_dispatch.cpp
// caches the decision. Workspace comes only from WorkspacePool::current().
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <optional>
#include <string>

#include "conv_params.h"

namespace rn::legacy {

// Chooses an algorithm and math type for params.direction, by params.algo_mode:
//   Find      cudnnFind*AlgorithmEx on the operands (outputs are overwritten; a backward-filter call that
//             accumulates searches on a scratch output instead), workspace: the largest any algorithm asks for
//             that the pool can give within the cap;
//   Heuristic cudnnGet*Algorithm_v7, the first candidate whose workspace can be had;
//   Fixed     params.fixed_algo; when its workspace cannot be had, the first heuristic candidate that fits.
// Candidates are filtered by determinism (params.deterministic) and by the math the precision allows (strict
// fp32 always runs with CUDNN_FMA_MATH; TF32 and bf16 never with down-conversion to fp16). Throws ValueError
// for a fixed algorithm that does not support the problem, CudnnError when no algorithm does.
AlgoChoice choose(const ConvParams& params, const ConvOperands& ops, cudnnHandle_t handle, cudaStream_t stream);

// Runs the plain convolution of params.direction: out = alpha1 * op(inputs) + beta * out. When the choice's
// workspace cannot be had now (out of memory), runs the first heuristic candidate that fits instead.
void run(const ConvParams& params, const AlgoChoice& choice, const ConvOperands& ops, cudnnHandle_t handle,
         cudaStream_t stream);

// Why a fused call did not run. `lasting`: the same key will be refused again (worth caching), as opposed to a
// momentary lack of workspace memory.
struct FusionRefusal {
  std::string reason;  // "unfused: <why>"
  bool lasting;
};

// Forward with the epilogue of params.epilogue: y = act(alpha1 * conv(x) + alpha2 * z + bias). With `try_fusion`,
// first as one cudnnConvolutionBiasActivationForward call; when cuDNN refuses (or it cannot run, e.g. no
// workspace now), and without `try_fusion`, as separate calls: the convolution, cudnnAddTensor (bias),
// cudnnAddTensor (alpha2 * z) and cudnnActivationForward (ReLU), the last three in place on y, which recomputes
// all of y. Returns why the fused call did not run (std::nullopt when it ran, or was not tried). Execution
// failures throw.
std::optional<FusionRefusal> run_forward_epilogue(const ConvParams& params, const AlgoChoice& choice,
                                                  const ConvOperands& ops, bool try_fusion, cudnnHandle_t handle,
                                                  cudaStream_t stream);

}  // namespace rn::legacy
