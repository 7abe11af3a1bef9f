// Batch normalization on cuDNN's batch-norm calls, NCHW or NHWC, fp32 / fp16 / bf16 activations with fp32
// gamma, beta and statistics, PyTorch's semantics: running = (1 - momentum) * running + momentum * batch, the
// running variance unbiased, save_invstd = 1 / sqrt(biased batch variance + eps).
//
// Mode: CUDNN_BATCHNORM_SPATIAL_PERSISTENT for NHWC (cuDNN's fast NHWC kernels, and the only mode with fused
// ops) and CUDNN_BATCHNORM_SPATIAL for NCHW, where cuDNN documents that the persistent mode reduces with scaled
// integer atomics that can overflow to inf/NaN on large activations (PyTorch avoids it there for accuracy).
// set_batch_norm_mode_policy() forces either mode; a persistent call cuDNN refuses is retried in spatial mode.
//
// NHWC (persistent mode) takes cuDNN's *Ex calls in every dtype: on NHWC the non-Ex calls pick cuDNN's generic
// single-read kernels, several times slower than the persistent NHWC ones (measured in benchmarks/RESULTS.md).
// Fusion: y = relu(bn(x) [+ z]) runs as ONE cudnnBatchNormalizationForwardTrainingEx call (ops BN_ACTIVATION /
// BN_ADD_ACTIVATION), and its gradient as one cudnnBatchNormalizationBackwardEx call, for fp16 and bf16 with C a
// multiple of 4 (set_batch_norm_fuse_bf16(false) keeps bf16 to BN ops). Otherwise the *Ex call runs with ops BN and
// the elementwise kernels (csrc/kernels/elementwise.h) add z and apply ReLU, and mask dy in backward; bn(x) + z
// without ReLU always does (cuDNN has no add-only op). NCHW takes the plain calls and those kernels.
// A *Ex call that cuDNN refuses is remembered per shape and ops: the fused ops narrow to BN ops, BN ops to the
// plain call. The training forward records per reserve buffer what it ran; the backward follows that record (the
// fused backward reads the ReLU mask the fused forward left in the reserve) and takes the plain call, which needs
// only y and is correct after either forward, without one. batch_norm_last_path() tells which path this thread's
// last call took.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <string>

#include "../core/tensor.h"

namespace rn {

enum class BatchNormModePolicy : uint8_t { Auto = 0, Persistent = 1, Spatial = 2 };

// Views are validated by the bindings: activations share x's shape and dtype, parameters are fp32 (C,).
// What both forwards take; inference takes nothing else.
struct BatchNormForwardArgs {
  Layout layout = Layout::NCHW;
  TensorView x, z, y;  // z undefined when absent
  TensorView gamma, beta, running_mean, running_var;
  double eps = 1e-5;
  bool relu = false;
};
using BatchNormInferArgs = BatchNormForwardArgs;

struct BatchNormTrainArgs : BatchNormForwardArgs {
  TensorView save_mean, save_invstd;
  TensorView reserve;  // opaque, at least batch_norm_reserve_size() bytes; undefined when that is 0
  double momentum = 0.1;
};

struct BatchNormBackwardArgs {
  Layout layout = Layout::NCHW;
  TensorView x, dy, y;  // y: the forward output, needed with relu (the mask)
  TensorView gamma, beta, save_mean, save_invstd;
  TensorView reserve;                // from the forward call; may be undefined (then the unfused backward runs)
  TensorView dx, dgamma, dbeta, dz;  // dz defined iff has_z
  double eps = 1e-5;
  bool relu = false;
  bool has_z = false;
  bool accumulate = false;  // dgamma/dbeta += instead of =
};

struct BatchNormPath {
  std::string op;      // "train", "infer" or "backward"
  bool fused = false;  // one cuDNN *Ex call did the whole op: BN [+ add + ReLU]
  bool ex = false;     // a *Ex call ran (cuDNN's persistent NHWC kernels), fused or followed by elementwise kernels
  std::string mode;    // "persistent" or "spatial"
  std::string detail;  // the calls that ran and, when unfused, why
};

void set_batch_norm_mode_policy(BatchNormModePolicy policy);
BatchNormModePolicy batch_norm_mode_policy();
void set_batch_norm_fuse_bf16(bool enabled);
bool batch_norm_fuse_bf16();
// Forget the shapes cuDNN refused to fuse (they are tried again).
void clear_batch_norm_refusals();

// Bytes of reserve space the training forward needs for this problem: 0 when it takes the unfused path, at least
// 4 on the fused path (the buffer is also the token by which the backward knows that a fused forward filled it).
size_t batch_norm_reserve_size(Layout layout, DType dtype, const std::array<int, 4>& nchw, bool relu, bool has_z,
                               cudaStream_t stream);

void batch_norm_forward_training(const BatchNormTrainArgs& args, cudaStream_t stream);
void batch_norm_forward_inference(const BatchNormInferArgs& args, cudaStream_t stream);
void batch_norm_backward(const BatchNormBackwardArgs& args, cudaStream_t stream);

// The path taken by this thread's last batch-norm call.
BatchNormPath batch_norm_last_path();

}  // namespace rn
