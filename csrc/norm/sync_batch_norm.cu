#include "sync_batch_norm.h"

#include <algorithm>

#include "../core/error.h"
#include "../core/float_convert.cuh"
#include "../core/launch_config.h"

namespace rn {
namespace {

constexpr int kWarp = 32;

// The shape of one problem: M = N * H * W elements per channel; NCHW planes are HW long.
struct Dims {
  int64_t n, c, hw;
  __host__ __device__ int64_t per_channel() const { return n * hw; }
  __host__ __device__ int64_t numel() const { return n * c * hw; }
};

Dims dims_of(const TensorView& x, Layout layout) {
  const auto d = nchw_dims(x, layout);
  return {d[0], d[1], int64_t(d[2]) * d[3]};
}

__device__ __forceinline__ int64_t channel_of(int64_t i, const Dims& d, bool nhwc) {
  return nhwc ? i % d.c : (i / d.hw) % d.c;
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// The two per-element terms each reduction sums: (x - shift, (x - shift)^2) forward.
template <typename T>
struct ForwardTerms {
  const T* x;
  const float* shift;
  __device__ void operator()(int64_t i, int64_t c, double& a, double& b) const {
    const double v = double(to_float(x[i])) - double(shift[c]);
    a += v;
    b += v * v;
  }
};

// (g, g * xhat) backward, g = dy through the ReLU mask; writes dz = g when asked.
template <typename T>
struct BackwardTerms {
  const T *dy, *y, *x;
  T* dz;
  const float *mean, *invstd;
  bool relu;
  __device__ void operator()(int64_t i, int64_t c, double& a, double& b) const {
    float g = to_float(dy[i]);
    if (relu && to_float(y[i]) <= 0.0f) g = 0.0f;
    if (dz) dz[i] = from_float<T>(g);
    const float xhat = (to_float(x[i]) - mean[c]) * invstd[c];
    a += g;
    b += double(g) * xhat;
  }
};

// NHWC: the activation is M rows of C channels. Each block takes a slab of rows; its threads walk the channels
// (consecutive threads, consecutive channels: coalesced), summing their channel's rows in fp64 registers; one
// atomic per channel and block at the end.
template <typename Terms>
__global__ void sums_nhwc_kernel(Terms terms, Dims d, int64_t rows_per_block, float* sums) {
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t r1 = min(r0 + rows_per_block, d.per_channel());
  for (int64_t c = threadIdx.x; c < d.c; c += blockDim.x) {
    double a = 0.0, b = 0.0;
    for (int64_t r = r0; r < r1; ++r) terms(r * d.c + c, c, a, b);
    atomicAdd(&sums[c], float(a));
    atomicAdd(&sums[d.c + c], float(b));
  }
}

// NCHW: N * C planes of HW contiguous elements. Each block takes planes in turn; its threads sum one plane in fp64,
// a block reduction, one atomic per plane.
template <typename Terms>
__global__ void sums_nchw_kernel(Terms terms, Dims d, float* sums) {
  __shared__ double partial[2][kThreadsPerBlock / kWarp];
  for (int64_t plane = blockIdx.x; plane < d.n * d.c; plane += gridDim.x) {
    const int64_t c = plane % d.c;
    double a = 0.0, b = 0.0;
    for (int64_t j = threadIdx.x; j < d.hw; j += blockDim.x) terms(plane * d.hw + j, c, a, b);
    a = warp_sum(a);
    b = warp_sum(b);
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    if (lane == 0) {
      partial[0][warp] = a;
      partial[1][warp] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double ta = 0.0, tb = 0.0;
      for (int w = 0; w < int(blockDim.x) / kWarp; ++w) {
        ta += partial[0][w];
        tb += partial[1][w];
      }
      atomicAdd(&sums[c], float(ta));
      atomicAdd(&sums[d.c + c], float(tb));
    }
    __syncthreads();  // partial is rewritten by the next plane
  }
}

template <typename Terms>
void launch_sums(const Terms& terms, const Dims& d, Layout layout, float* sums, cudaStream_t stream) {
  RN_CUDA_CHECK(cudaMemsetAsync(sums, 0, sizeof(float) * 2 * d.c, stream));
  if (d.numel() == 0) return;
  if (layout == Layout::NHWC) {
    const int threads = int(std::min<int64_t>(kThreadsPerBlock, (d.c + kWarp - 1) / kWarp * kWarp));
    // Enough slabs to fill the GPU several times over, each at least a few rows long.
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(int64_t(sm_count()) * 8, d.per_channel() / 4));
    const int64_t rows = (d.per_channel() + blocks - 1) / blocks;
    const int64_t used = (d.per_channel() + rows - 1) / rows;
    sums_nhwc_kernel<<<unsigned(used), threads, 0, stream>>>(terms, d, rows, sums);
  } else {
    const int64_t blocks = std::min<int64_t>(d.n * d.c, int64_t(sm_count()) * 8);
    sums_nchw_kernel<<<unsigned(blocks), kThreadsPerBlock, 0, stream>>>(terms, d, sums);
  }
  RN_CUDA_CHECK_LAUNCH();
}

// Per channel: the batch statistics of all ranks, the saved ones and the running ones (PyTorch's update, the
// running variance unbiased).
__global__ void finalize_kernel(const float* sums, int64_t c_count, double count, float eps, float momentum,
                                float* running_mean, float* running_var, float* save_mean, float* save_invstd) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= c_count) return;
  const double shift = running_mean[c];
  const double offset = double(sums[c]) / count;
  const double var = max(double(sums[c_count + c]) / count - offset * offset, 0.0);
  const double mean = shift + offset;
  save_mean[c] = float(mean);
  save_invstd[c] = float(1.0 / sqrt(var + double(eps)));
  running_mean[c] = float((1.0 - momentum) * shift + momentum * mean);
  const double unbiased = count > 1 ? var * count / (count - 1) : var;
  running_var[c] = float((1.0 - momentum) * double(running_var[c]) + momentum * unbiased);
}

template <typename T>
__global__ void apply_kernel(const T* x, const T* z, T* y, const float* mean, const float* invstd, const float* gamma,
                             const float* beta, Dims d, bool nhwc, bool relu) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < d.numel(); i += stride) {
    const int64_t c = channel_of(i, d, nhwc);
    float v = (to_float(x[i]) - mean[c]) * invstd[c] * gamma[c] + beta[c];
    if (z) v += to_float(z[i]);
    if (relu) v = relu_f(v);
    y[i] = from_float<T>(v);
  }
}

__global__ void param_grads_kernel(const float* sums, int64_t c_count, float* dgamma, float* dbeta, bool accumulate) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= c_count) return;
  dgamma[c] = (accumulate ? dgamma[c] : 0.0f) + sums[c_count + c];
  dbeta[c] = (accumulate ? dbeta[c] : 0.0f) + sums[c];
}

template <typename T>
__global__ void backward_kernel(const T* dy, const T* y, const T* x, T* dx, const float* mean, const float* invstd,
                                const float* gamma, const float* sums, double inv_count, Dims d, bool nhwc, bool relu) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < d.numel(); i += stride) {
    const int64_t c = channel_of(i, d, nhwc);
    float g = to_float(dy[i]);
    if (relu && to_float(y[i]) <= 0.0f) g = 0.0f;
    const float xhat = (to_float(x[i]) - mean[c]) * invstd[c];
    const float mean_g = float(double(sums[c]) * inv_count);
    const float mean_gx = float(double(sums[d.c + c]) * inv_count);
    dx[i] = from_float<T>(gamma[c] * invstd[c] * (g - mean_g - xhat * mean_gx));
  }
}

unsigned channel_blocks(int64_t c) {
  return unsigned((c + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

template <typename T>
const T* ptr(const TensorView& t) {
  return t.defined() ? static_cast<const T*>(t.data) : nullptr;
}

template <typename T>
T* mut(const TensorView& t) {
  return t.defined() ? static_cast<T*>(t.data) : nullptr;
}

}  // namespace

void sync_bn_sums(const TensorView& x, const TensorView& shift, const TensorView& sums, Layout layout,
                  cudaStream_t stream) {
  const Dims d = dims_of(x, layout);
  dispatch_dtype(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_sums(ForwardTerms<T>{ptr<T>(x), ptr<float>(shift)}, d, layout, mut<float>(sums), stream);
  });
}

void sync_bn_forward(const SyncBnForwardArgs& a, cudaStream_t stream) {
  const Dims d = dims_of(a.x, a.layout);
  finalize_kernel<<<channel_blocks(d.c), kThreadsPerBlock, 0, stream>>>(
      ptr<float>(a.sums), d.c, a.count, a.eps, a.momentum, mut<float>(a.running_mean), mut<float>(a.running_var),
      mut<float>(a.save_mean), mut<float>(a.save_invstd));
  RN_CUDA_CHECK_LAUNCH();
  if (d.numel() == 0) return;
  dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    apply_kernel<T><<<grid_size(d.numel()), kThreadsPerBlock, 0, stream>>>(
        ptr<T>(a.x), ptr<T>(a.z), mut<T>(a.y), ptr<float>(a.save_mean), ptr<float>(a.save_invstd), ptr<float>(a.gamma),
        ptr<float>(a.beta), d, a.layout == Layout::NHWC, a.relu);
    RN_CUDA_CHECK_LAUNCH();
  });
}

void sync_bn_grad_sums(const SyncBnBackwardArgs& a, cudaStream_t stream) {
  const Dims d = dims_of(a.x, a.layout);
  dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const BackwardTerms<T> terms{
        ptr<T>(a.dy), ptr<T>(a.y), ptr<T>(a.x), mut<T>(a.dz), ptr<float>(a.save_mean), ptr<float>(a.save_invstd),
        a.relu};
    launch_sums(terms, d, a.layout, mut<float>(a.sums), stream);
  });
  param_grads_kernel<<<channel_blocks(d.c), kThreadsPerBlock, 0, stream>>>(
      ptr<float>(a.sums), d.c, mut<float>(a.dgamma), mut<float>(a.dbeta), a.accumulate);
  RN_CUDA_CHECK_LAUNCH();
}

void sync_bn_backward(const SyncBnBackwardArgs& a, cudaStream_t stream) {
  const Dims d = dims_of(a.x, a.layout);
  if (d.numel() == 0) return;
  dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_kernel<T><<<grid_size(d.numel()), kThreadsPerBlock, 0, stream>>>(
        ptr<T>(a.dy), ptr<T>(a.y), ptr<T>(a.x), mut<T>(a.dx), ptr<float>(a.save_mean), ptr<float>(a.save_invstd),
        ptr<float>(a.gamma), ptr<float>(a.sums), 1.0 / a.count, d, a.layout == Layout::NHWC, a.relu);
    RN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace rn
