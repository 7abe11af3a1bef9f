#include "channel_sums.h"

#include "../core/error.h"
#include "../core/float_convert.cuh"

namespace rn::kernels {
namespace {

constexpr int kColumns = 32;  // channels per block, one per lane of a warp
constexpr int kLanes = 32;    // warps per block, each summing every kLanes-th row or run
static_assert(kColumns == kLanes, "with inner > 1, warp y sums the block's channel y");

// dy seen as (outer, channels, inner): NHWC is (N*H*W, K, 1), NCHW is (N, K, H*W). A block sums kColumns
// channels. With inner == 1 a warp reads kColumns neighbouring channels of one row; otherwise a warp reads one
// channel's contiguous run. Each thread adds a fixed set of elements in order, then the block adds the partial
// sums in a fixed order: the result does not depend on scheduling.
template <typename T>
__global__ void channel_sums_kernel(const T* dy, T* out, int64_t outer, int64_t channels, int64_t inner) {
  __shared__ double partial[kLanes][kColumns + 1];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kColumns;
  const int64_t count = outer * inner;  // elements per channel
  if (inner == 1) {
    const int64_t c = first + threadIdx.x;
    double total = 0.0;
    if (c < channels) {
      for (int64_t r = threadIdx.y; r < outer; r += kLanes) total += to_float(dy[r * channels + c]);
    }
    partial[threadIdx.y][threadIdx.x] = total;
  } else {
    const int64_t c = first + threadIdx.y;  // warp y sums channel first + y (kColumns == kLanes)
    double total = 0.0;
    if (c < channels) {
      for (int64_t j = threadIdx.x; j < count; j += kColumns) {
        const int64_t o = j / inner, i = j - o * inner;
        total += to_float(dy[(o * channels + c) * inner + i]);
      }
    }
    partial[threadIdx.x][threadIdx.y] = total;
  }
  __syncthreads();
  if (threadIdx.y == 0) {
    const int64_t c = first + threadIdx.x;
    if (c < channels) {
      double sum = 0.0;
      for (int k = 0; k < kLanes; ++k) sum += partial[k][threadIdx.x];
      out[c] = from_float<T>(static_cast<float>(sum));
    }
  }
}

}  // namespace

void channel_sums(const TensorView& dy, const TensorView& out, Layout layout, cudaStream_t stream) {
  const std::array<int, 4> d = nchw_dims(dy, layout);  // N, K, H, W
  const int64_t channels = d[1];
  const int64_t spatial = static_cast<int64_t>(d[2]) * d[3];
  const int64_t outer = layout == Layout::NHWC ? d[0] * spatial : d[0];
  const int64_t inner = layout == Layout::NHWC ? 1 : spatial;
  const auto blocks = static_cast<unsigned>((channels + kColumns - 1) / kColumns);
  if (blocks == 0) return;
  dispatch_dtype(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    channel_sums_kernel<T><<<blocks, dim3(kColumns, kLanes), 0, stream>>>(
        static_cast<const T*>(dy.data), static_cast<T*>(out.data), outer, channels, inner);
    RN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace rn::kernels
