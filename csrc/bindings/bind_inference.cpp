// Python binding of the inference engine's input stage: uint8 HWC images -> the normalised model input
// (csrc/kernels/normalize_u8.h). resnet_native/inference/input_stage.py wraps it.
//
// The core's element types (DType) are the storage dtypes, which tensor_arg parses; uint8 is not one of them.
// So the images arrive as their device address and shape, read from the array by the Python wrapper (which
// checks dtype, rank, channels and contiguity, naming the argument); here the address is checked to be memory
// of the current device and disjoint from the output, and the table and output go through tensor_arg.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>

#include "../core/error.h"
#include "../kernels/normalize_u8.h"
#include "../kernels/op_args.h"
#include "bindings.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace rn {
namespace {

int64_t image_bytes(int64_t n, int64_t height, int64_t width) {
  if (n < 1 || height < 1 || width < 1) {
    throw ValueError("images: expected a non-empty (N, H, W, 3) array, got N=" + std::to_string(n) +
                     ", H=" + std::to_string(height) + ", W=" + std::to_string(width));
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n, height, &bytes) || __builtin_mul_overflow(bytes, width, &bytes) ||
      __builtin_mul_overflow(bytes, kernels::ImagesU8::kChannels, &bytes)) {
    throw ValueError("images: (N, H, W, 3) = (" + std::to_string(n) + ", " + std::to_string(height) + ", " +
                     std::to_string(width) + ", 3) overflows a 64-bit element count");
  }
  return bytes;
}

void normalize_u8_op(uintptr_t images_address, int64_t n, int64_t height, int64_t width, py::handle lut_obj,
                     py::handle out_obj, const std::string& layout_name, const std::string& dtype_name,
                     uintptr_t stream) {
  const Layout layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  kernels::ImagesU8 images;
  images.n = n;
  images.height = height;
  images.width = width;
  const int64_t bytes = image_bytes(n, height, width);
  if (images_address == 0) throw TypeError("images: null device address");
  images.data = reinterpret_cast<const uint8_t*>(images_address);

  OpArgs args("normalize_u8");
  const TensorView& lut = args.array(lut_obj, "lut", dtype, 2);
  const TensorView& out = args.array(out_obj, "out", dtype, 4);
  check_shape(lut, "lut", {3, 256});
  if (layout == Layout::NHWC) {
    check_shape(out, "out", {n, height, width, 3});
  } else {
    check_shape(out, "out", {n, 3, height, width});
  }
  check_disjoint(out, "out", lut, "lut");
  const auto out_begin = reinterpret_cast<uintptr_t>(out.data);
  if (images_address < out_begin + out.nbytes() && out_begin < images_address + static_cast<uintptr_t>(bytes)) {
    throw ValueError("out must not share memory with images");
  }
  args.set_note("images=uint8(" + std::to_string(n) + ", " + std::to_string(height) + ", " + std::to_string(width) +
                ", 3), layout=" + layout_name);
  args.check_on_device();
  TensorView images_view;  // only its address is read: where the images live
  images_view.data = reinterpret_cast<void*>(images_address);
  images_view.ndim = 1;
  images_view.shape[0] = 1;
  check_on_current_device(images_view, "images");
  OpContext context(&OpArgs::describe, &args);
  kernels::normalize_u8(images, lut, out, layout, stream_arg(stream));
}

}  // namespace

void bind_inference(py::module_& m) {
  m.def("normalize_u8", &normalize_u8_op, py::arg("images_address"), py::arg("n"), py::arg("height"), py::arg("width"),
        py::arg("lut"), py::arg("out"), py::arg("layout"), py::arg("dtype"), py::arg("stream"),
        "out = lut[c][images[n, h, w, c]] in the layout: uint8 HWC images (given by device address and shape) "
        "to the normalised model input.");
}

}  // namespace rn
