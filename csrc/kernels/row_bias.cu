#include "row_bias.h"

#include "../core/error.h"
#include "../core/launch_config.h"

namespace rn::kernels {
namespace {

constexpr int kColumns = 32;   // a warp's columns: the loads of a row are coalesced
constexpr int kRowLanes = 32;  // threads per column, each summing every kRowLanes-th row

__global__ void add_row_bias_kernel(float* y, const float* bias, int64_t n, int64_t columns) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] += bias[i % columns];
  }
}

__global__ void sum_rows_kernel(const float* dy, float* out, int64_t rows, int64_t columns, bool accumulate) {
  __shared__ double partial[kRowLanes][kColumns];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  double total = 0.0;
  if (c < columns) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) total += dy[r * columns + c];
  }
  partial[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && c < columns) {
    double sum = 0.0;
    for (int k = 0; k < kRowLanes; ++k) sum += partial[k][threadIdx.x];  // a fixed order: deterministic
    out[c] = static_cast<float>(accumulate ? sum + out[c] : sum);
  }
}

}  // namespace

void add_row_bias(const TensorView& y, const TensorView& bias, cudaStream_t stream) {
  const int64_t n = y.numel();
  add_row_bias_kernel<<<grid_size(n), kThreadsPerBlock, 0, stream>>>(
      static_cast<float*>(y.data), static_cast<const float*>(bias.data), n, bias.numel());
  RN_CUDA_CHECK_LAUNCH();
}

void sum_rows(const TensorView& dy, const TensorView& out, bool accumulate, cudaStream_t stream) {
  const int64_t columns = out.numel();
  const int64_t rows = columns == 0 ? 0 : dy.numel() / columns;
  const dim3 block(kColumns, kRowLanes);
  const auto blocks = static_cast<unsigned>((columns + kColumns - 1) / kColumns);
  if (blocks == 0) return;
  sum_rows_kernel<<<blocks, block, 0, stream>>>(static_cast<const float*>(dy.data), static_cast<float*>(out.data), rows,
                                                columns, accumulate);
  RN_CUDA_CHECK_LAUNCH();
}

}  // namespace rn::kernels
