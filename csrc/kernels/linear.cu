#include "linear.h"

#include "../core/error.h"
#include "../core/float_convert.cuh"

namespace rn::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // forward: one warp a row
constexpr int kThreads = 256;     // backward data: one thread an element
constexpr int kColumns = 32;      // backward weight: input channels a block, one a lane
constexpr int kSlices = 16;       // backward weight: warps a block, each summing every kSlices-th row
constexpr int kOutputs = 16;      // outputs a pass holds in registers (forward, backward weight)
constexpr int kRowUnroll = 4;     // backward weight: rows a warp has in flight

__device__ __forceinline__ float warp_sum(float v) {  // a fixed butterfly: the same order every time
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T>
__global__ void forward_kernel(const T* x, const float* w, const float* b, float* y, int64_t n, int64_t c, int64_t k) {
  // A warp's rows: threadIdx.y is the same across a warp, so a warp runs its shuffles whole. Each lane reads its
  // inputs once per kOutputs outputs, which it accumulates side by side.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y; row < n;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * c;
    for (int64_t first = 0; first < k; first += kOutputs) {
      const int outputs = static_cast<int>(k - first < kOutputs ? k - first : kOutputs);
      float acc[kOutputs];
#pragma unroll
      for (int j = 0; j < kOutputs; ++j) acc[j] = 0.0f;
      for (int64_t i = threadIdx.x; i < c; i += kWarp) {
        const float v = to_float(xr[i]);
#pragma unroll
        for (int j = 0; j < kOutputs; ++j) {
          if (j < outputs) acc[j] = fmaf(v, w[(first + j) * c + i], acc[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kOutputs; ++j) {
        if (j < outputs) {
          const float sum = warp_sum(acc[j]);
          if (threadIdx.x == 0) y[row * k + first + j] = sum + b[first + j];
        }
      }
    }
  }
}

template <typename T>
__global__ void backward_data_kernel(const float* dy, const float* w, T* dx, int64_t n, int64_t c, int64_t k) {
  const int64_t total = n * c;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / c, col = e - row * c;
    const float* g = dy + row * k;
    float acc = 0.0f;
    for (int64_t o = 0; o < k; ++o) acc = fmaf(g[o], w[o * c + col], acc);
    dx[e] = from_float<T>(acc);
  }
}

// A block owns kColumns input channels; warp s sums rows s, s + kSlices, ... for each of up to kOutputs outputs at
// a time, then warp 0 adds the kSlices partial sums in order.
template <typename T>
__global__ void backward_weight_kernel(const T* x, const float* dy, float* dw, int64_t n, int64_t c, int64_t k) {
  __shared__ float partial[kSlices][kOutputs][kColumns];
  // The loops' bounds depend on the block alone, so every thread reaches each __syncthreads.
  for (int64_t tile = blockIdx.x; tile * kColumns < c; tile += gridDim.x) {
    const int64_t col = tile * kColumns + threadIdx.x;
    const bool live = col < c;
    for (int64_t first = 0; first < k; first += kOutputs) {
      const int outputs = static_cast<int>(k - first < kOutputs ? k - first : kOutputs);
      float acc[kOutputs];
#pragma unroll
      for (int j = 0; j < kOutputs; ++j) acc[j] = 0.0f;
      if (live) {
#pragma unroll kRowUnroll
        for (int64_t row = threadIdx.y; row < n; row += kSlices) {
          const float v = to_float(x[row * c + col]);
          const float* g = dy + row * k + first;
#pragma unroll
          for (int j = 0; j < kOutputs; ++j) {
            if (j < outputs) acc[j] = fmaf(g[j], v, acc[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kOutputs; ++j) partial[threadIdx.y][j][threadIdx.x] = acc[j];
      __syncthreads();
      if (threadIdx.y == 0 && live) {
        for (int j = 0; j < outputs; ++j) {
          float sum = 0.0f;
          for (int s = 0; s < kSlices; ++s) sum += partial[s][j][threadIdx.x];
          dw[(first + j) * c + col] = sum;
        }
      }
      __syncthreads();
    }
  }
}

unsigned blocks_for(int64_t items, int64_t per_block) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 65535 * 64 ? blocks : 65535 * 64);
}

}  // namespace

void linear_forward(const TensorView& x, const TensorView& w, const TensorView& b, const TensorView& y,
                    cudaStream_t stream) {
  const int64_t n = x.shape[0], c = x.shape[1], k = w.shape[0];
  dispatch_dtype(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<T><<<blocks_for(n, kRowsPerBlock), dim3(kWarp, kRowsPerBlock), 0, stream>>>(
        static_cast<const T*>(x.data), static_cast<const float*>(w.data), static_cast<const float*>(b.data),
        static_cast<float*>(y.data), n, c, k);
    RN_CUDA_CHECK_LAUNCH();
  });
}

void linear_backward_data(const TensorView& dy, const TensorView& w, const TensorView& dx, cudaStream_t stream) {
  const int64_t n = dx.shape[0], c = dx.shape[1], k = w.shape[0];
  dispatch_dtype(dx.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_data_kernel<T><<<blocks_for(n * c, kThreads), kThreads, 0, stream>>>(
        static_cast<const float*>(dy.data), static_cast<const float*>(w.data), static_cast<T*>(dx.data), n, c, k);
    RN_CUDA_CHECK_LAUNCH();
  });
}

void linear_backward_weight(const TensorView& x, const TensorView& dy, const TensorView& dw, cudaStream_t stream) {
  const int64_t n = x.shape[0], c = x.shape[1], k = dw.shape[0];
  dispatch_dtype(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_weight_kernel<T><<<blocks_for(c, kColumns), dim3(kColumns, kSlices), 0, stream>>>(
        static_cast<const T*>(x.data), static_cast<const float*>(dy.data), static_cast<float*>(dw.data), n, c, k);
    RN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace rn::kernels
