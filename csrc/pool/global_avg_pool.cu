#include "global_avg_pool.h"

#include "../core/error.h"
#include "../core/float_convert.cuh"
#include "../core/launch_config.h"

namespace rn {
namespace {

constexpr int kWarp = 32;

// NCHW: each (n, c) row of H * W elements is contiguous; one warp per row, coalesced reads, shuffle reduction.
template <typename T>
__global__ void mean_rows_kernel(const T* x, T* y, int64_t rows, int64_t hw) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_per_grid = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  const float inv = 1.0f / static_cast<float>(hw);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; row < rows;
       row += warps_per_grid) {
    const T* src = x + row * hw;
    float sum = 0.0f;
    for (int64_t i = lane; i < hw; i += kWarp) sum += to_float(src[i]);
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) y[row] = from_float<T>(sum * inv);
  }
}

// NHWC: thread (n, c) walks the H * W positions with stride C; neighbouring threads read neighbouring channels.
template <typename T>
__global__ void mean_strided_kernel(const T* x, T* y, int64_t n, int64_t c, int64_t hw) {
  const float inv = 1.0f / static_cast<float>(hw);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * c; i += stride) {
    const T* src = x + (i / c) * hw * c + i % c;
    float sum = 0.0f;
    for (int64_t k = 0; k < hw; ++k) sum += to_float(src[k * c]);
    y[i] = from_float<T>(sum * inv);
  }
}

template <typename T>
__global__ void spread_kernel(const T* dy, T* dx, int64_t total, int64_t c, int64_t hw, bool nchw) {
  const float inv = 1.0f / static_cast<float>(hw);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    // NCHW: i / hw is n * C + c. NHWC: (i / (hw * C)) * C + i % C.
    const int64_t source = nchw ? i / hw : (i / (hw * c)) * c + i % c;
    dx[i] = from_float<T>(to_float(dy[source]) * inv);
  }
}

}  // namespace

void global_avg_pool_forward(const TensorView& x, const TensorView& y, Layout layout, cudaStream_t stream) {
  const auto d = nchw_dims(x, layout);
  const int64_t n = d[0], c = d[1], hw = static_cast<int64_t>(d[2]) * d[3];
  dispatch_dtype(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = static_cast<const T*>(x.data);
    T* dst = static_cast<T*>(y.data);
    if (layout == Layout::NCHW) {
      const int64_t rows = n * c;
      const int blocks = grid_size(rows * kWarp);  // one warp per row
      mean_rows_kernel<T><<<blocks, kThreadsPerBlock, 0, stream>>>(src, dst, rows, hw);
    } else {
      mean_strided_kernel<T><<<grid_size(n * c), kThreadsPerBlock, 0, stream>>>(src, dst, n, c, hw);
    }
    RN_CUDA_CHECK_LAUNCH();
  });
}

void global_avg_pool_backward(const TensorView& dy, const TensorView& dx, Layout layout, cudaStream_t stream) {
  const auto d = nchw_dims(dx, layout);
  const int64_t c = d[1], hw = static_cast<int64_t>(d[2]) * d[3];
  const int64_t total = dx.numel();
  dispatch_dtype(dx.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    spread_kernel<T><<<grid_size(total), kThreadsPerBlock, 0, stream>>>(
        static_cast<const T*>(dy.data), static_cast<T*>(dx.data), total, c, hw, layout == Layout::NCHW);
    RN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace rn
