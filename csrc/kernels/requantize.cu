#include "requantize.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "../core/error.h"
#include "../core/launch_config.h"

namespace rn::kernels {
namespace {

template <bool kZFp8>
__device__ float decode(const uint8_t code) {
  if constexpr (kZFp8) {
    __nv_fp8_e4m3 value;
    value.__x = code;
    return static_cast<float>(value);
  } else {
    return static_cast<float>(static_cast<int8_t>(code));
  }
}

// Out: 0 int8, 1 FP8 E4M3, 2 fp32.
template <int kOut>
__device__ void store(void* out, int64_t i, float value) {
  if constexpr (kOut == 0) {
    const float clamped = fminf(fmaxf(rintf(value), -127.0f), 127.0f);  // rintf: nearest, ties to even
    static_cast<int8_t*>(out)[i] = static_cast<int8_t>(clamped);
  } else if constexpr (kOut == 1) {
    static_cast<uint8_t*>(out)[i] = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
  } else {
    static_cast<float*>(out)[i] = value;
  }
}

template <bool kZFp8, int kOut>
__global__ void residual_requantize_kernel(const __half* __restrict__ v, const uint8_t* __restrict__ z, float s_z,
                                           float inv_s_y, bool relu, void* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float value = __half2float(v[i]) + s_z * decode<kZFp8>(z[i]);
    if (relu) value = fmaxf(value, 0.0f);
    store<kOut>(out, i, value * inv_s_y);
  }
}

template <bool kZFp8>
void launch(const TensorView& v, const TensorView& z, float s_z, float inv_s_y, bool relu, const TensorView& out,
            cudaStream_t stream) {
  const int64_t n = v.numel();
  const auto* vp = static_cast<const __half*>(v.data);
  const auto* zp = static_cast<const uint8_t*>(z.data);
  if (out.dtype == DType::F32) {
    residual_requantize_kernel<kZFp8, 2>
        <<<grid_size(n), kThreadsPerBlock, 0, stream>>>(vp, zp, s_z, inv_s_y, relu, out.data, n);
  } else if (out.dtype == DType::FP8) {
    residual_requantize_kernel<kZFp8, 1>
        <<<grid_size(n), kThreadsPerBlock, 0, stream>>>(vp, zp, s_z, inv_s_y, relu, out.data, n);
  } else {
    residual_requantize_kernel<kZFp8, 0>
        <<<grid_size(n), kThreadsPerBlock, 0, stream>>>(vp, zp, s_z, inv_s_y, relu, out.data, n);
  }
  RN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void residual_requantize(const TensorView& v, const TensorView& z, bool z_fp8, float s_z, float inv_s_y, bool relu,
                         const TensorView& out, cudaStream_t stream) {
  if (v.numel() == 0) return;
  if (z_fp8) {
    launch<true>(v, z, s_z, inv_s_y, relu, out, stream);
  } else {
    launch<false>(v, z, s_z, inv_s_y, relu, out, stream);
  }
}

}  // namespace rn::kernels
