#include "cross_entropy.h"

#include <cmath>
#include <cstdint>

#include "../core/error.h"
#include "../core/launch_config.h"

namespace rn::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kForwardThreads = 1024;  // the forward is one block: its row sums are added in a fixed order
constexpr unsigned kFullMask = 0xffffffffu;

// Which of two (value, index) candidates is the argmax so far: NaN beats everything (NumPy's argmax returns the
// first NaN), then the larger value, then the smaller index.
__device__ __forceinline__ bool beats(float v, int j, float m, int a) {
  const bool v_nan = isnan(v), m_nan = isnan(m);
  if (v_nan || m_nan) return v_nan && (!m_nan || j < a);
  return v > m || (v == m && j < a);
}

// One row of logits as a group of G lanes of a warp sees it (G a power of two <= 32; every lane of the warp
// calls this together, lanes past the last row with valid = false, so the shuffles stay warp-uniform).
struct RowStats {
  float max = -INFINITY;
  int argmax = INT32_MAX;
  float sum_exp = 0.0f;  // sum_j exp(z_j - max)
  float sum_z = 0.0f;
  float z_label = NAN;  // z[label]; NaN for a label outside [0, C)
  int label = -1;
};

template <int G>
__device__ __forceinline__ RowStats row_stats(const float* logits, const int32_t* labels, int64_t row, int c,
                                              bool valid, int lane_in_row) {
  RowStats s;
  const float* z = logits + row * c;
  if (valid) {
    for (int j = lane_in_row; j < c; j += G) {
      const float v = z[j];
      if (beats(v, j, s.max, s.argmax)) {
        s.max = v;
        s.argmax = j;
      }
      s.sum_z += v;
    }
  }
#pragma unroll
  for (int o = G / 2; o > 0; o /= 2) {
    const float m = __shfl_xor_sync(kFullMask, s.max, o, G);
    const int a = __shfl_xor_sync(kFullMask, s.argmax, o, G);
    if (beats(m, a, s.max, s.argmax)) {
      s.max = m;
      s.argmax = a;
    }
    s.sum_z += __shfl_xor_sync(kFullMask, s.sum_z, o, G);
  }
  if (valid) {
    for (int j = lane_in_row; j < c; j += G) s.sum_exp += expf(z[j] - s.max);
    s.label = labels[row];
    if (s.label >= 0 && s.label < c) s.z_label = z[s.label];
  }
#pragma unroll
  for (int o = G / 2; o > 0; o /= 2) s.sum_exp += __shfl_xor_sync(kFullMask, s.sum_exp, o, G);
  return s;
}

__device__ __forceinline__ float row_loss(const RowStats& s, float smoothing, int c) {
  const float logsumexp = s.max + logf(s.sum_exp);
  return logsumexp - ((1.0f - smoothing) * s.z_label + smoothing / c * s.sum_z);
}

// One block of kForwardThreads: groups of G lanes walk the rows; each thread keeps the loss sum and hit count of
// the rows it led, then a shared-memory tree (a fixed order) adds them up.
template <int G>
__global__ void __launch_bounds__(kForwardThreads)
    forward_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels, int64_t n, int c,
                   float smoothing, CrossEntropyOutputs out) {
  __shared__ double loss_part[kForwardThreads];
  __shared__ int64_t hit_part[kForwardThreads];
  const int lane_in_row = threadIdx.x % G;
  const int64_t rows_per_pass = kForwardThreads / G;
  double loss = 0.0;
  int64_t hits = 0;
  // The loop bound is uniform per warp (rounded up to whole passes), so every lane reaches every shuffle.
  for (int64_t base = 0; base < n; base += rows_per_pass) {
    const int64_t row = base + threadIdx.x / G;
    const bool valid = row < n;
    const RowStats s = row_stats<G>(logits, labels, valid ? row : 0, c, valid, lane_in_row);
    if (valid && lane_in_row == 0) {
      loss += row_loss(s, smoothing, c);
      hits += s.argmax == s.label;
    }
  }
  loss_part[threadIdx.x] = loss;
  hit_part[threadIdx.x] = hits;
  __syncthreads();
  for (int half = kForwardThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      loss_part[threadIdx.x] += loss_part[threadIdx.x + half];
      hit_part[threadIdx.x] += hit_part[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double total = loss_part[0];
    if (out.mean_loss) *out.mean_loss = static_cast<float>(total / static_cast<double>(n));
    if (out.correct) *out.correct = static_cast<int32_t>(hit_part[0]);
    if (out.loss_sum) *out.loss_sum += total;
    if (out.correct_sum) *out.correct_sum += static_cast<double>(hit_part[0]);
  }
}

// Grid-stride over rows, G lanes per row. grad may alias logits: a lane writes only the elements it read, after
// the row's shuffles (which every lane of the warp has passed).
template <int G>
__global__ void backward_kernel(const float* logits, const int32_t* __restrict__ labels, int64_t n, int c,
                                float smoothing, ScalarArg scale, float* grad) {
  const float factor = read_scalar(scale) / static_cast<float>(n);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t first_row = thread / G;
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * blockDim.x / G;
  const int lane_in_row = threadIdx.x % G;
  const float off_target = smoothing / c;
  // Whole warps iterate together (the bound is rounded to the warp's first row) so the shuffles stay uniform.
  const int64_t warp_first_row = first_row - (threadIdx.x % kWarp) / G;
  for (int64_t row0 = warp_first_row; row0 < n; row0 += row_stride) {
    const int64_t row = row0 + (threadIdx.x % kWarp) / G;
    const bool valid = row < n;
    const RowStats s = row_stats<G>(logits, labels, valid ? row : 0, c, valid, lane_in_row);
    if (!valid) continue;
    const bool label_ok = s.label >= 0 && s.label < c;
    const float inv_sum = 1.0f / s.sum_exp;
    const float* z = logits + row * c;
    float* g = grad + row * c;
    for (int j = lane_in_row; j < c; j += G) {
      const float target = label_ok ? off_target + (j == s.label ? 1.0f - smoothing : 0.0f) : NAN;
      g[j] = (expf(z[j] - s.max) * inv_sum - target) * factor;
    }
  }
}

// Rows of up to 64 classes take one thread each (no shuffles); wider rows a whole warp.
constexpr int kOneLaneMaxClasses = 64;

}  // namespace

void cross_entropy_forward(const TensorView& logits, const TensorView& labels, float label_smoothing,
                           const CrossEntropyOutputs& out, cudaStream_t stream) {
  const int64_t n = logits.shape[0];
  const int c = static_cast<int>(logits.shape[1]);
  const auto* z = static_cast<const float*>(logits.data);
  const auto* y = static_cast<const int32_t*>(labels.data);
  if (c <= kOneLaneMaxClasses) {
    forward_kernel<1><<<1, kForwardThreads, 0, stream>>>(z, y, n, c, label_smoothing, out);
  } else {
    forward_kernel<kWarp><<<1, kForwardThreads, 0, stream>>>(z, y, n, c, label_smoothing, out);
  }
  RN_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(const TensorView& logits, const TensorView& labels, float label_smoothing, ScalarArg scale,
                            const TensorView& grad, cudaStream_t stream) {
  const int64_t n = logits.shape[0];
  const int c = static_cast<int>(logits.shape[1]);
  const auto* z = static_cast<const float*>(logits.data);
  const auto* y = static_cast<const int32_t*>(labels.data);
  auto* g = static_cast<float*>(grad.data);
  if (c <= kOneLaneMaxClasses) {
    backward_kernel<1><<<grid_size(n), kThreadsPerBlock, 0, stream>>>(z, y, n, c, label_smoothing, scale, g);
  } else {
    backward_kernel<kWarp>
        <<<grid_size(n * kWarp), kThreadsPerBlock, 0, stream>>>(z, y, n, c, label_smoothing, scale, g);
  }
  RN_CUDA_CHECK_LAUNCH();
}

}  // namespace rn::kernels
