#include "normalize_u8.h"

#include "../core/error.h"
#include "../core/launch_config.h"

namespace rn::kernels {
namespace {

constexpr int kLutEntries = 3 * 256;

// One output element per thread and grid-stride step. T is an unsigned integer of the storage dtype's size:
// the table holds the final bits, so values are only moved. The table is staged in shared memory once per
// block (a few KB), so every gather after that is an on-chip read.
template <typename T, bool kNchw>
__global__ void normalize_u8_kernel(const uint8_t* __restrict__ images, const T* __restrict__ lut, T* __restrict__ out,
                                    int64_t total, int64_t pixels_per_image) {
  __shared__ T table[kLutEntries];
  for (int i = threadIdx.x; i < kLutEntries; i += blockDim.x) table[i] = lut[i];
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    int64_t source;
    int channel;
    if (kNchw) {
      // o = (image * 3 + channel) * pixels + pixel; the source is HWC: (image * pixels + pixel) * 3 + channel.
      const int64_t plane = o / pixels_per_image;
      const int64_t pixel = o - plane * pixels_per_image;
      const int64_t image = plane / ImagesU8::kChannels;
      channel = static_cast<int>(plane - image * ImagesU8::kChannels);
      source = (image * pixels_per_image + pixel) * ImagesU8::kChannels + channel;
    } else {
      source = o;  // HWC in, HWC out: the same index
      channel = static_cast<int>(o % ImagesU8::kChannels);
    }
    out[o] = table[channel * 256 + images[source]];
  }
}

template <typename T>
void launch(const ImagesU8& images, const TensorView& lut, const TensorView& out, Layout layout, cudaStream_t stream) {
  const int64_t total = images.bytes();
  const int64_t pixels = images.height * images.width;
  const auto* src = images.data;
  const auto* table = static_cast<const T*>(lut.data);
  auto* dst = static_cast<T*>(out.data);
  if (layout == Layout::NCHW) {
    normalize_u8_kernel<T, true><<<grid_size(total), kThreadsPerBlock, 0, stream>>>(src, table, dst, total, pixels);
  } else {
    normalize_u8_kernel<T, false><<<grid_size(total), kThreadsPerBlock, 0, stream>>>(src, table, dst, total, pixels);
  }
  RN_CUDA_CHECK_LAUNCH();
}

// NHWC out with `channels` >= 3 per pixel: the first 3 gathered, the rest 0.
__global__ void normalize_u8_padded_kernel(const uint8_t* __restrict__ images, const uint8_t* __restrict__ lut,
                                           uint8_t* __restrict__ out, int64_t total, int channels) {
  __shared__ uint8_t table[kLutEntries];
  for (int i = threadIdx.x; i < kLutEntries; i += blockDim.x) table[i] = lut[i];
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int64_t pixel = o / channels;
    const int channel = static_cast<int>(o - pixel * channels);
    out[o] = channel < ImagesU8::kChannels ? table[channel * 256 + images[pixel * ImagesU8::kChannels + channel]] : 0;
  }
}

}  // namespace

void normalize_u8_padded(const ImagesU8& images, const TensorView& lut, const TensorView& out, int64_t out_channels,
                         cudaStream_t stream) {
  const int64_t total = images.n * images.height * images.width * out_channels;
  normalize_u8_padded_kernel<<<grid_size(total), kThreadsPerBlock, 0, stream>>>(
      images.data, static_cast<const uint8_t*>(lut.data), static_cast<uint8_t*>(out.data), total,
      static_cast<int>(out_channels));
  RN_CUDA_CHECK_LAUNCH();
}

void normalize_u8(const ImagesU8& images, const TensorView& lut, const TensorView& out, Layout layout,
                  cudaStream_t stream) {
  if (dtype_size(out.dtype) == 4) {
    launch<uint32_t>(images, lut, out, layout, stream);
  } else {
    launch<uint16_t>(images, lut, out, layout, stream);
  }
}

}  // namespace rn::kernels
