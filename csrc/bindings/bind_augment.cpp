// Python bindings of the training pipeline's augmentation kernel (csrc/kernels/augment_u8.h) and of progressive
// resizing's downscale (downscale_u8.h); resnet_native/data/augment.py (launch_augment) and data/resize.py wrap them.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "../core/error.h"
#include "../kernels/augment_u8.h"
#include "../kernels/downscale_u8.h"
#include "bindings.h"
#include "image_args.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

int64_t index_arg(py::handle obj, const char* name) {
  const int v = int32_arg(obj, name);
  if (v < 0) throw ValueError(std::string(name) + ": expected an int >= 0, got " + std::to_string(v));
  return v;
}

py::object augment_op(py::handle images_obj, py::handle params_obj, py::handle start_obj, py::handle size_obj,
                      py::handle lut_obj, py::handle out_obj, py::handle layout_obj, py::handle crop_padding_obj,
                      py::handle cutout_obj, py::handle labels_obj, py::handle labels_out_obj, uintptr_t stream) {
  const Layout layout = layout_arg(layout_obj);
  kernels::AugmentBatch batch;
  batch.start = index_arg(start_obj, "batch_start");
  batch.size = index_arg(size_obj, "batch");
  batch.crop_padding = static_cast<int>(index_arg(crop_padding_obj, "crop_padding"));
  batch.cutout = static_cast<int>(index_arg(cutout_obj, "cutout"));
  if (batch.size == 0) throw ValueError("batch: expected an int >= 1, got 0");

  OpArgs args("augment_u8");
  const TensorView& images = images_arg(args, images_obj);
  TensorArgOptions two_d;
  two_d.ndim = 2;
  const TensorView& params = args.input(params_obj, "params", DType::I32, two_d);
  if (params.shape[0] != kernels::kAugmentRows) {
    throw ValueError("params: expected an int32 (6, M) parameter table, got shape " + params.shape_str());
  }
  batch.params = static_cast<const int32_t*>(params.data);
  batch.columns = params.shape[1];
  if (batch.start + batch.size > batch.columns) {
    throw ValueError("batch: [" + std::to_string(batch.start) + ", " + std::to_string(batch.start + batch.size) +
                     ") is outside the table's " + std::to_string(batch.columns) + " columns");
  }
  // lut's dtype is out's: float32, float16 or bf16 bits (uint16); the kernel only moves the table's bits.
  TensorArgOptions lut_options;
  lut_options.ndim = 2;
  const TensorView& lut = args.input(lut_obj, "lut", DTypeRequest::infer(/*uint16_is_bf16=*/true), lut_options);
  check_shape(lut, "lut", {3, 256});
  const TensorView& out =
      image_batch_output(args, out_obj, lut.dtype, layout, batch.size, images.shape[1], images.shape[2]);
  check_disjoint(out, "out", {{images, "images"}, {params, "params"}, {lut, "lut"}});

  TensorArgOptions one_d;
  one_d.ndim = 1;
  const TensorView& labels = args.optional_input(labels_obj, "labels", DType::I32, one_d);
  const TensorView& labels_out = args.optional_output(labels_out_obj, "labels_out", DType::I32, one_d);
  if (labels.defined() != labels_out.defined()) {  // both (the batch's labels are gathered) or neither
    throw ValueError(labels.defined()
                         ? "labels_out: expected an int32 array of shape (batch,) since labels is given"
                         : "labels: expected an int32 array of the images' labels since labels_out is given");
  }
  if (labels.defined()) {
    check_shape(labels, "labels", {images.shape[0]});
    check_shape(labels_out, "labels_out", {batch.size});
    check_disjoint(labels_out, "labels_out", {{labels, "labels"}, {params, "params"}, {out, "out"}});
    batch.labels = static_cast<const int32_t*>(labels.data);
    batch.labels_out = static_cast<int32_t*>(labels_out.data);
  }
  args.set_note(std::string("layout=") + layout_name(layout));
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::augment_u8(source_of(images), batch, lut, out, layout, stream_arg(stream));
  return args.object(out);
}

// out (N, size, size, 3) = images downscaled through the row weights wy (size, H) and column weights wx (size, W).
py::object downscale_op(py::handle images_obj, py::handle wy_obj, py::handle wx_obj, py::handle out_obj,
                        uintptr_t stream) {
  OpArgs args("downscale_u8");
  const TensorView& images = images_arg(args, images_obj);
  TensorArgOptions two_d;
  two_d.ndim = 2;
  two_d.int32_dims = true;
  const TensorView& wy = args.input(wy_obj, "wy", DType::F64, two_d);
  const TensorView& wx = args.input(wx_obj, "wx", DType::F64, two_d);
  const int64_t size = wy.shape[0];
  if (size < 1 || size > images.shape[1] || size > images.shape[2]) {
    throw ValueError("wy: expected between 1 and min(H, W) = " +
                     std::to_string(std::min(images.shape[1], images.shape[2])) + " rows, got " + std::to_string(size));
  }
  check_shape(wy, "wy", {size, images.shape[1]});
  check_shape(wx, "wx", {size, images.shape[2]});
  TensorArgOptions four_d;
  four_d.ndim = 4;
  four_d.writable = true;
  const TensorView& out = args.input(out_obj, "out", DType::U8, four_d);
  check_shape(out, "out", {images.shape[0], size, size, kernels::ImagesU8::kChannels});
  check_disjoint(out, "out", {{images, "images"}, {wy, "wy"}, {wx, "wx"}});
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::downscale_u8(source_of(images), static_cast<const double*>(wy.data), static_cast<const double*>(wx.data),
                        static_cast<int>(size), static_cast<uint8_t*>(out.data), stream_arg(stream));
  return args.object(out);
}

}  // namespace

void bind_augment(py::module_& m) {
  m.def("augment_u8", &augment_op, py::arg("images"), py::arg("params"), py::arg("batch_start"), py::arg("batch"),
        py::arg("lut"), py::arg("out"), py::arg("layout"), py::arg("crop_padding"), py::arg("cutout"),
        py::arg("labels"), py::arg("labels_out"), py::arg("stream"),
        "out[b] = augment(images[params[0, batch_start + b]]): crop, flip, Cutout and normalisation through lut, "
        "in the layout; labels_out[b] = labels[params[0, batch_start + b]] when both are given. Returns out "
        "(allocated when None).");
  m.def("downscale_u8", &downscale_op, py::arg("images"), py::arg("wy"), py::arg("wx"), py::arg("out"),
        py::arg("stream"),
        "out[n, y, x, c] = round(sum over (h, w) of wy[y, h] * wx[x, w] * images[n, h, w, c]) in float64, clipped "
        "to [0, 255]; returns out");
}

}  // namespace rn
