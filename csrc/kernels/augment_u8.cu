#include "augment_u8.h"

#include "../core/error.h"
#include "../core/launch_config.h"

namespace rn::kernels {
namespace {

constexpr int kLutEntries = 3 * 256;
constexpr int kChannels = static_cast<int>(ImagesU8::kChannels);

// One output pixel (all three channels) per thread and grid-stride step. T is an unsigned integer of the storage
// dtype's size: the table holds the final bits, so values are only moved; it is staged in shared memory once per
// block.
template <typename T, bool kNchw>
__global__ void augment_kernel(ImagesU8 images, AugmentBatch batch, const T* __restrict__ lut, T* __restrict__ out) {
  __shared__ T table[kLutEntries];
  for (int i = threadIdx.x; i < kLutEntries; i += blockDim.x) table[i] = lut[i];
  __syncthreads();
  const int64_t height = images.height, width = images.width, pixels = height * width;
  const int64_t total = batch.size * pixels;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int pad = batch.crop_padding, cut = batch.cutout;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t b = t / pixels;
    const int64_t p = t - b * pixels;
    const int y = static_cast<int>(p / width), x = static_cast<int>(p - (p / width) * width);
    const int32_t* column = batch.params + batch.start + b;
    const int64_t image = column[kRowIndex * batch.columns];
    const int flip = column[kRowFlip * batch.columns];
    // int64: any int32 in the table (offsets, Cutout centres) keeps the arithmetic exact.
    const int64_t sy = int64_t{y} + column[kRowOffsetY * batch.columns] - pad;
    const int64_t sx = (flip ? width - 1 - x : int64_t{x}) + column[kRowOffsetX * batch.columns] - pad;
    const int64_t cut_y0 = int64_t{column[kRowCutY * batch.columns]} - cut / 2;
    const int64_t cut_x0 = int64_t{column[kRowCutX * batch.columns]} - cut / 2;
    // A source index outside the set reads nothing: its image comes out black and its label -1 (which the loss
    // turns into NaN), never a read out of bounds.
    const bool known = image >= 0 && image < images.n;
    const bool inside = known && sy >= 0 && sy < height && sx >= 0 && sx < width;
    const bool in_cut = cut > 0 && y >= cut_y0 && y < cut_y0 + cut && x >= cut_x0 && x < cut_x0 + cut;
    const uint8_t* src = images.data + (image * pixels + (inside ? sy * width + sx : 0)) * kChannels;
    for (int c = 0; c < kChannels; ++c) {
      const T v = in_cut ? T(0) : table[c * 256 + (inside ? src[c] : 0)];
      out[kNchw ? (b * kChannels + c) * pixels + p : t * kChannels + c] = v;
    }
    if (p == 0 && batch.labels_out != nullptr) batch.labels_out[b] = known ? batch.labels[image] : -1;
  }
}

template <typename T>
void launch(const ImagesU8& images, const AugmentBatch& batch, const TensorView& lut, const TensorView& out,
            Layout layout, cudaStream_t stream) {
  const int64_t total = batch.size * images.height * images.width;
  const auto* table = static_cast<const T*>(lut.data);
  auto* dst = static_cast<T*>(out.data);
  if (layout == Layout::NCHW) {
    augment_kernel<T, true><<<grid_size(total), kThreadsPerBlock, 0, stream>>>(images, batch, table, dst);
  } else {
    augment_kernel<T, false><<<grid_size(total), kThreadsPerBlock, 0, stream>>>(images, batch, table, dst);
  }
  RN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void augment_u8(const ImagesU8& images, const AugmentBatch& batch, const TensorView& lut, const TensorView& out,
                Layout layout, cudaStream_t stream) {
  if (dtype_size(out.dtype) == 4) {
    launch<uint32_t>(images, batch, lut, out, layout, stream);
  } else {
    launch<uint16_t>(images, batch, lut, out, layout, stream);
  }
}

}  // namespace rn::kernels
