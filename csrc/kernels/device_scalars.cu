#include "device_scalars.h"

#include "../core/error.h"

namespace rn::kernels {
namespace {

struct ScalarValues {
  float v[kMaxScalars];
};

__global__ void write_scalars_kernel(float* dst, ScalarValues values, int count) {
  for (int i = 0; i < count; ++i) dst[i] = values.v[i];
}

__global__ void advance_step_kernel(float* step, const int32_t* found_inf) {
  if (found_inf == nullptr || *found_inf == 0) *step += 1.0f;
}

__global__ void update_loss_scale_kernel(float* scale, int32_t* tracker, const int32_t* found_inf, float growth,
                                         float backoff, int32_t interval) {
  if (*found_inf != 0) {
    *scale *= backoff;
    *tracker = 0;
    return;
  }
  const int32_t good_steps = *tracker + 1;
  if (good_steps >= interval) {
    *scale *= growth;
    *tracker = 0;
  } else {
    *tracker = good_steps;
  }
}

__global__ void reciprocal_scale_kernel(const float* scale, float* inv_scale) {
  *inv_scale = 1.0f / *scale;
}

}  // namespace

void write_scalars(float* dst, const float* values, int count, cudaStream_t stream) {
  ScalarValues packed{};
  for (int i = 0; i < count; ++i) packed.v[i] = values[i];
  write_scalars_kernel<<<1, 1, 0, stream>>>(dst, packed, count);
  RN_CUDA_CHECK_LAUNCH();
}

void advance_step(float* step, const int32_t* found_inf, cudaStream_t stream) {
  advance_step_kernel<<<1, 1, 0, stream>>>(step, found_inf);
  RN_CUDA_CHECK_LAUNCH();
}

void update_loss_scale(float* scale, int32_t* tracker, const int32_t* found_inf, float growth, float backoff,
                       int32_t interval, cudaStream_t stream) {
  update_loss_scale_kernel<<<1, 1, 0, stream>>>(scale, tracker, found_inf, growth, backoff, interval);
  RN_CUDA_CHECK_LAUNCH();
}

void reciprocal_scale(const float* scale, float* inv_scale, cudaStream_t stream) {
  reciprocal_scale_kernel<<<1, 1, 0, stream>>>(scale, inv_scale);
  RN_CUDA_CHECK_LAUNCH();
}

}  // namespace rn::kernels
