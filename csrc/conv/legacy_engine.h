// The legacy (cudnnConvolution*) convolution engine: forward, backward-data and backward-filter of 2-D
// convolutions with any stride/pad/dilation/groups in NCHW or NHWC, fp32 (strict FMA) / TF32 / fp16 / bf16
// with fp32 accumulation, plus the fused forward epilogue of cudnnConvolutionBiasActivationForward.
// Same shape as the graph engine (graph_engine.h): choose() decides, run() executes; conv_dispatch.cpp
// caches the decision. Workspace comes only from WorkspacePool::current().
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <optional>
#include <string>
#include <vector>

#include "conv_params.h"

namespace rn::legacy {

// cuDNN's algorithm names of a direction without their prefix, indexed by enum value: forward
// "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", ...; backward-data "ALGO_0", "ALGO_1", "FFT", ...
const std::vector<std::string>& algo_names(ConvDirection direction);
// The name of one algorithm ("algo<N>" when out of range).
std::string algo_name(ConvDirection direction, int algo);
// False for the algorithms cuDNN documents as non-deterministic (atomic accumulation).
bool algo_is_deterministic(ConvDirection direction, int algo);
// "DEFAULT_MATH", "TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION", "FMA_MATH".
std::string math_type_name(int math_type);

// Chooses an algorithm and math type for params.direction:
//   Find      cudnnFind*AlgorithmEx on the operands (outputs are overwritten; a backward-filter call that
//             accumulates searches on a scratch output instead), workspace: the largest any algorithm asks for
//             that the pool can give within the cap;
//   Heuristic cudnnGet*Algorithm_v7, the first candidate whose workspace can be had;
//   Fixed     `fixed_algo`; when its workspace cannot be had, the first heuristic candidate that fits.
// Candidates are filtered by determinism (params.deterministic) and by the math the precision allows (strict
// fp32 always runs with CUDNN_FMA_MATH; TF32 and bf16 never with down-conversion to fp16). Throws ValueError
// for a fixed algorithm that does not support the problem, CudnnError when no algorithm does.
AlgoChoice choose(const ConvParams& params, const ConvOperands& ops, AlgoMode mode, int fixed_algo,
                  cudnnHandle_t handle, cudaStream_t stream);

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

// Forward with the epilogue of params.epilogue in one cudnnConvolutionBiasActivationForward call:
// y = act(alpha1 * conv(x) + alpha2 * z + bias). Returns std::nullopt when it ran, or why it did not (the
// caller then runs run_forward_unfused, which recomputes all of y). Execution failures throw.
std::optional<FusionRefusal> try_forward_fused(const ConvParams& params, const AlgoChoice& choice,
                                               const ConvOperands& ops, cudnnHandle_t handle, cudaStream_t stream);
// The same epilogue as separate calls: convolution, cudnnAddTensor (bias), cudnnAddTensor (alpha2 * z),
// cudnnActivationForward (ReLU), the last three in place on y.
void run_forward_unfused(const ConvParams& params, const AlgoChoice& choice, const ConvOperands& ops,
                         cudnnHandle_t handle, cudaStream_t stream);

// db = sum of dy over N, H, W (cudnnConvolutionBackwardBias); dy is 4-D in `layout`, db has shape (K,).
void backward_bias(const TensorView& dy, const TensorView& db, Layout layout, cudnnHandle_t handle);

}  // namespace rn::legacy
