// Python binding of the inference engine's input stage: uint8 HWC images -> the normalised model input
// (csrc/kernels/normalize_u8.h). resnet_native/inference/input_stage.py wraps it.
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../core/error.h"
#include "../kernels/normalize_u8.h"
#include "../kernels/requantize.h"
#include "bindings.h"
#include "image_args.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

py::object normalize_u8_op(py::handle images_obj, py::handle lut_obj, py::handle out_obj, py::handle layout_obj,
                           py::handle dtype_obj, uintptr_t stream) {
  const Layout layout = layout_arg(layout_obj);
  const DType dtype = exact_dtype_arg(dtype_obj);
  OpArgs args("normalize_u8");
  const TensorView& images = images_arg(args, images_obj);
  const TensorView& lut = lut_arg(args, lut_obj, dtype);
  const TensorView& out =
      image_batch_output(args, out_obj, dtype, layout, images.shape[0], images.shape[1], images.shape[2]);
  check_disjoint(out, "out", {{images, "images"}, {lut, "lut"}});
  args.set_note(std::string("layout=") + layout_name(layout));
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::normalize_u8(source_of(images), lut, out, layout, stream_arg(stream));
  return args.object(out);
}

// The quantised engines' input stage: lut and out int8 (int8 engine) or uint8 (FP8 codes), out NHWC with
// `channels` >= 3 (zero-padded).
py::object normalize_u8_padded_op(py::handle images_obj, py::handle lut_obj, py::handle out_obj, bool fp8,
                                  int64_t channels, uintptr_t stream) {
  const DType dtype = fp8 ? DType::FP8 : DType::I8;
  if (channels < 3 || channels > 4096) throw ValueError("channels: expected 3..4096, got " + std::to_string(channels));
  OpArgs args("normalize_u8_padded");
  const TensorView& images = images_arg(args, images_obj);
  const TensorView& lut = lut_arg(args, lut_obj, dtype);
  TensorArgOptions four_d;
  four_d.ndim = 4;
  const std::vector<int64_t> out_shape{images.shape[0], images.shape[1], images.shape[2], channels};
  const TensorView& out = args.output(out_obj, "out", dtype, out_shape, four_d);
  check_shape(out, "out", {out_shape[0], out_shape[1], out_shape[2], out_shape[3]});
  check_disjoint(out, "out", {{images, "images"}, {lut, "lut"}});
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::normalize_u8_padded(source_of(images), lut, out, channels, stream_arg(stream));
  return args.object(out);
}

// out = encode(relu(v + s_z * z) * inv_s_y): the quantised engines' residual add (kernels/requantize.h).
py::object residual_requantize_op(py::handle v_obj, py::handle z_obj, py::handle out_obj, bool fp8, bool out_fp32,
                                  float s_z, float inv_s_y, bool relu, uintptr_t stream) {
  if (!std::isfinite(s_z) || !std::isfinite(inv_s_y)) throw ValueError("s_z, inv_s_y: expected finite numbers");
  OpArgs args("residual_requantize");
  const TensorView& v = args.input(v_obj, "v", DType::F16);
  const TensorView& z = args.input(z_obj, "z", fp8 ? DType::FP8 : DType::I8);
  check_same_shape(z, "z", v, "v");
  const DType out_dtype = out_fp32 ? DType::F32 : fp8 ? DType::FP8 : DType::I8;
  const TensorView& out = args.output(out_obj, "out", out_dtype, shape_of(v));
  check_same_shape(out, "out", v, "v");
  check_disjoint(out, "out", {{v, "v"}, {z, "z"}});
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::residual_requantize(v, z, fp8, s_z, inv_s_y, relu, out, stream_arg(stream));
  return args.object(out);
}

}  // namespace

void bind_inference(py::module_& m) {
  m.def("normalize_u8", &normalize_u8_op, py::arg("images"), py::arg("lut"), py::arg("out"), py::arg("layout"),
        py::arg("dtype"), py::arg("stream"),
        "out = lut[c][images[n, h, w, c]] in the layout: uint8 (N, H, W, 3) images to the normalised model input; "
        "returns out (allocated when None).");
  m.def("normalize_u8_padded", &normalize_u8_padded_op, py::arg("images"), py::arg("lut"), py::arg("out"),
        py::arg("fp8"), py::arg("channels"), py::arg("stream"),
        "out[n, h, w, c] = lut[c][images[n, h, w, c]] for c < 3, 0 up to `channels`: int8 (fp8=False) or uint8 FP8 "
        "codes; the quantised engines' input. Returns out (allocated when None).");
  m.def("residual_requantize", &residual_requantize_op, py::arg("v"), py::arg("z"), py::arg("out"), py::arg("fp8"),
        py::arg("out_fp32"), py::arg("s_z"), py::arg("inv_s_y"), py::arg("relu"), py::arg("stream"),
        "out = encode([relu](v + s_z * z) * inv_s_y): fp16 v, int8 / FP8 z, int8 / FP8 / float32 out; returns out.");
}

}  // namespace rn
