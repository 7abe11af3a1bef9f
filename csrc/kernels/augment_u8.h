// The training pipeline's augmentation kernel: one launch per batch gathers each output pixel from the uint8 image
// set through a per-image parameter table (random crop with zero padding, horizontal flip, Cutout), normalises it
// through the lookup table of normalize_u8.h, writes the model's layout and storage dtype, and gathers the batch's
// labels. resnet_native/data/augment.py samples the table and holds the NumPy reference (apply_reference).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../core/tensor.h"
#include "normalize_u8.h"

namespace rn::kernels {

// Rows of the int32 (6, M) parameter table; column j describes the j-th image of the epoch.
enum AugmentRow : int { kRowIndex = 0, kRowOffsetY, kRowOffsetX, kRowFlip, kRowCutY, kRowCutX, kAugmentRows };

struct AugmentBatch {
  const int32_t* params = nullptr;  // (kAugmentRows, columns), C-contiguous
  int64_t columns = 0;
  int64_t start = 0;  // the batch is columns [start, start + size)
  int64_t size = 0;
  int crop_padding = 0;             // offsets lie in [0, 2 * crop_padding]; offset == crop_padding is no shift
  int cutout = 0;                   // side of the Cutout square (0: none)
  const int32_t* labels = nullptr;  // (n,) labels of the image set, or null
  int32_t* labels_out = nullptr;    // (size,): labels_out[b] = labels[params[kRowIndex][start + b]], or null
};

// out: (size, h, w, 3) for NHWC, (size, 3, h, w) for NCHW, in lut's storage dtype (2 or 4 bytes). A source index
// outside [0, images.n) gives a black image and label -1.
void augment_u8(const ImagesU8& images, const AugmentBatch& batch, const TensorView& lut, const TensorView& out,
                Layout layout, cudaStream_t stream);

}  // namespace rn::kernels
