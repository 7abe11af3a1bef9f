// Progressive resizing's downscale of a uint8 image set (resnet_native/data/resize.py): each output value the
// float64 sum of the source pixels its row and column weights cover (an antialiased bilinear reduction whose
// separable weights the caller computes), rounded half up and clipped to [0, 255], so that the result equals the
// NumPy reference bit for bit. Shapes are checked by the caller.
#pragma once

#include <cuda_runtime_api.h>

#include "../core/tensor.h"
#include "normalize_u8.h"

namespace rn::kernels {

// out (n, size, size, 3) uint8; wy (size, images.height) and wx (size, images.width) float64.
void downscale_u8(const ImagesU8& images, const double* wy, const double* wx, int size, uint8_t* out,
                  cudaStream_t stream);

}  // namespace rn::kernels
