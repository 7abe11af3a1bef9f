#include "image_args.h"

#include <vector>

#include "../core/error.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace rn {

const TensorView& images_arg(OpArgs& args, py::handle images_obj) {
  TensorArgOptions four_d;
  four_d.ndim = 4;
  four_d.int32_dims = true;
  const TensorView& images = args.input(images_obj, "images", DType::U8, four_d);
  if (images.shape[3] != kernels::ImagesU8::kChannels) {
    throw ValueError("images: expected (N, H, W, 3) RGB pixels in HWC order, got shape " + images.shape_str());
  }
  return images;
}

const TensorView& lut_arg(OpArgs& args, py::handle lut_obj, DType dtype) {
  TensorArgOptions two_d;
  two_d.ndim = 2;
  const TensorView& lut = args.input(lut_obj, "lut", dtype, two_d);
  check_shape(lut, "lut", {3, 256});
  return lut;
}

kernels::ImagesU8 source_of(const TensorView& images) {
  kernels::ImagesU8 source;
  source.data = static_cast<const uint8_t*>(images.data);
  source.n = images.shape[0];
  source.height = images.shape[1];
  source.width = images.shape[2];
  return source;
}

const TensorView& image_batch_output(OpArgs& args, py::handle out_obj, DType dtype, Layout layout, int64_t n, int64_t h,
                                     int64_t w) {
  const std::vector<int64_t> shape =
      layout == Layout::NHWC ? std::vector<int64_t>{n, h, w, 3} : std::vector<int64_t>{n, 3, h, w};
  TensorArgOptions four_d;
  four_d.ndim = 4;
  const TensorView& out = args.output(out_obj, "out", dtype, shape, four_d);
  check_shape(out, "out", {shape[0], shape[1], shape[2], shape[3]});
  return out;
}

}  // namespace rn
