// Multi-tensor optimizer kernels: each function is ONE kernel launch over every tensor of its lists (see
// tensor_table.h for how the work is cut). Lists are validated by the caller (check_table / check_table_dtype):
// equal sizes, fp32 parameters and optimizer state, grads in any storage dtype, model copies in any storage
// dtype with absent entries allowed.
//
// Scalars that change from step to step (learning rate, momentum / beta1 under a one-cycle schedule, inverse loss
// scale, Adam's step count) may live on the device, so that a captured CUDA graph or a loss scaler that never
// syncs with the host can drive them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "scalar_arg.h"
#include "tensor_table.h"

namespace rn::kernels {

struct SgdOptions {
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // PyTorch's first step: momentum buffer = gradient (no dampening)
};

struct AdamWOptions {
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// PyTorch SGD on g = grad * inv_scale: g += wd * p; buf = momentum * buf + (1 - dampening) * g (buf = g on the
// first step); g = nesterov ? g + momentum * buf : buf; p -= lr * g; copies[i] = p where present.
// `bufs` may be null when momentum is a host 0. Nothing is written when *found_inf != 0 (found_inf may be null).
void sgd_step(const TensorTable& params, const TensorTable& grads, const TensorTable* bufs, const TensorTable* copies,
              ScalarArg lr, ScalarArg inv_scale, ScalarArg momentum, const int32_t* found_inf,
              const SgdOptions& options, cudaStream_t stream);

// PyTorch AdamW on g = grad * inv_scale: p *= 1 - lr * wd; m += (1 - beta1) * (g - m);
// v = beta2 * v + (1 - beta2) * g^2; p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
void adamw_step(const TensorTable& params, const TensorTable& grads, const TensorTable& exp_avgs,
                const TensorTable& exp_avg_sqs, const TensorTable* copies, ScalarArg lr, ScalarArg inv_scale,
                ScalarArg step, ScalarArg beta1, const int32_t* found_inf, const AdamWOptions& options,
                cudaStream_t stream);

// *found_inf = 1 when any element is inf or NaN; never reset to 0.
void check_finite(const TensorTable& tensors, int32_t* found_inf, cudaStream_t stream);
// Every element = 0.
void zero(const TensorTable& tensors, cudaStream_t stream);
// Every element *= factor.
void scale(const TensorTable& tensors, ScalarArg factor, cudaStream_t stream);

}  // namespace rn::kernels
