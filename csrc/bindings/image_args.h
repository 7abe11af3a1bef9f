// The arguments every uint8-image op takes (the inference engine's input stage, the training augmentation): the
// images and the normalisation lookup table, parsed into OpArgs with errors naming them.
#pragma once

#include <pybind11/pybind11.h>

#include "../kernels/normalize_u8.h"
#include "op_args.h"

namespace rn {

// images: a uint8 (N, H, W, 3) device array, RGB in HWC order.
const TensorView& images_arg(OpArgs& args, pybind11::handle images_obj);
// lut: a (3, 256) array of `dtype` (resnet_native.data.augment.normalization_lut).
const TensorView& lut_arg(OpArgs& args, pybind11::handle lut_obj, DType dtype);
// The kernels' description of a parsed images view.
kernels::ImagesU8 source_of(const TensorView& images);
// out: the normalised batch of n images of h x w, (n, h, w, 3) for NHWC or (n, 3, h, w) for NCHW, in `dtype`
// (allocated when None).
const TensorView& image_batch_output(OpArgs& args, pybind11::handle out_obj, DType dtype, Layout layout, int64_t n,
                                     int64_t h, int64_t w);

}  // namespace rn
