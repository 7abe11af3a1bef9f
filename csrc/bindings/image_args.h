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

}  // namespace rn
