// Synchronized batch norm: the statistics of every rank's batch together, from per-channel sums that the caller
// adds across ranks (an all-reduce of a (2, C) fp32 array) between the two halves of each direction.
//
//   forward:  sums = [sum(x - shift), sum((x - shift)^2)] over this rank's N, H, W   (sync_bn_sums)
//             ... all-reduce sums ...
//             mean, biased var over `count` elements of all ranks -> save_mean, save_invstd, running stats;
//             y = [relu](gamma * (x - mean) * invstd + beta [+ z])                   (sync_bn_forward)
//   backward: g = dy through the ReLU mask of y; sums = [sum(g), sum(g * xhat)] (this rank's); dgamma, dbeta
//             (+)= the local sums (the gradient all-reduce averages them later); dz = g  (sync_bn_grad_sums)
//             ... all-reduce sums ...
//             dx = gamma * invstd * (g - sums[0] / count - xhat * sums[1] / count)   (sync_bn_backward)
//
// shift is the running mean (the same on every rank, since the running statistics are updated from the global
// ones): summing about it keeps the variance from cancelling in fp32. Sums accumulate in fp64 within a block and
// are added into the fp32 output with atomics. Kernels only: no workspace, no allocation, no synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include "../core/dtype.h"
#include "../core/tensor.h"

namespace rn {

struct SyncBnForwardArgs {
  Layout layout = Layout::NHWC;
  TensorView x, z, y;                                 // activations; z optional
  TensorView sums;                                    // (2, C) fp32, all ranks' sums about running_mean
  TensorView gamma, beta, running_mean, running_var;  // (C,) fp32; the running statistics are updated
  TensorView save_mean, save_invstd;                  // (C,) fp32 outputs
  double count = 0;                                   // elements per channel over all ranks
  float eps = 1e-5f, momentum = 0.1f;
  bool relu = false;
};

struct SyncBnBackwardArgs {
  Layout layout = Layout::NHWC;
  TensorView x, dy, y;  // y: the forward output (its ReLU mask), when relu
  TensorView dx, dz;    // dz optional (has_z)
  TensorView gamma, save_mean, save_invstd;
  TensorView sums;           // (2, C) fp32
  TensorView dgamma, dbeta;  // (C,) fp32
  double count = 0;
  bool relu = false, accumulate = false;
};

// sums = [sum(x - shift), sum((x - shift)^2)] per channel over this rank's x.
void sync_bn_sums(const TensorView& x, const TensorView& shift, const TensorView& sums, Layout layout,
                  cudaStream_t stream);
// Statistics from the all-ranks sums (a.sums, about a.running_mean), then y.
void sync_bn_forward(const SyncBnForwardArgs& a, cudaStream_t stream);
// This rank's gradient sums into a.sums, dgamma / dbeta from them, dz.
void sync_bn_grad_sums(const SyncBnBackwardArgs& a, cudaStream_t stream);
// dx from the all-ranks gradient sums in a.sums.
void sync_bn_backward(const SyncBnBackwardArgs& a, cudaStream_t stream);

}  // namespace rn
