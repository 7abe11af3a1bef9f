// One-thread kernels on the few float32 / int32 device scalars a training step keeps on the device (so a captured
// CUDA graph or a loss scaler that never syncs with the host can drive them): the learning-rate writes, Adam's
// step count and the dynamic loss scale. Compiled with the extension (nothing compiles at run time). The pointers
// are validated by the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace rn::kernels {

constexpr int kMaxScalars = 8;

// dst[i] = values[i] for i < count (<= kMaxScalars): the values travel as kernel arguments, so nothing is read
// from host memory when the kernel runs.
void write_scalars(float* dst, const float* values, int count, cudaStream_t stream);
// step[0] += 1 unless found_inf (may be null) holds a nonzero value.
void advance_step(float* step, const int32_t* found_inf, cudaStream_t stream);
// PyTorch GradScaler's rule on shape-(1,) arrays: on inf/nan (found_inf != 0) scale *= backoff and tracker = 0;
// else tracker += 1 and, once tracker >= interval, scale *= growth and tracker = 0.
void update_loss_scale(float* scale, int32_t* tracker, const int32_t* found_inf, float growth, float backoff,
                       int32_t interval, cudaStream_t stream);
// inv_scale[0] = 1 / scale[0].
void reciprocal_scale(const float* scale, float* inv_scale, cudaStream_t stream);

}  // namespace rn::kernels
