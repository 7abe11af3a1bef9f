// uint8 images -> the model's normalised input, through a per-channel lookup table: a server can hand raw
// pixels to the inference engine and the network sees exactly the values the training pipeline produced (the
// table is resnet_native.data.augment.normalization_lut, which already holds the final storage-dtype bits, so
// the kernel only gathers: no arithmetic, nothing to round differently).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../core/tensor.h"

namespace rn::kernels {

// The uint8 source: a C-contiguous (n, height, width, 3) HWC array at `data` (validated by the caller).
struct ImagesU8 {
  const uint8_t* data = nullptr;
  int64_t n = 0, height = 0, width = 0;
  static constexpr int64_t kChannels = 3;
  int64_t bytes() const { return n * height * width * kChannels; }
};

// out = lut[c][images[n, h, w, c]] in `layout`: (n, h, w, 3) for NHWC, (n, 3, h, w) for NCHW. lut is (3, 256)
// in out's dtype (any storage dtype: only the element size matters). Shapes are checked by the caller; out
// must not overlap the images.
void normalize_u8(const ImagesU8& images, const TensorView& lut, const TensorView& out, Layout layout,
                  cudaStream_t stream);

// The quantised engines' input: out = lut[c][images[n, h, w, c]] for c < 3 and 0 for 3 <= c < out_channels, NHWC
// (n, h, w, out_channels) with one-byte elements (int8 values or FP8 codes: lut holds them, already quantised).
// The zero channels pad the stem's input to the channel multiple the 8-bit convolutions need.
void normalize_u8_padded(const ImagesU8& images, const TensorView& lut, const TensorView& out, int64_t out_channels,
                         cudaStream_t stream);

}  // namespace rn::kernels
