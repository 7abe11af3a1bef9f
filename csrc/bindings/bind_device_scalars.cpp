// Python bindings of the device-scalar kernels (csrc/kernels/device_scalars.h); resnet_native/multi_tensor.py and
// resnet_native/optim/grad_scaler.py wrap them.
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "../core/error.h"
#include "../kernels/device_scalars.h"
#include "bindings.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

void write_scalars_op(py::handle dst_obj, py::handle values_obj, uintptr_t stream) {
  if (!PyList_Check(values_obj.ptr()) && !PyTuple_Check(values_obj.ptr())) {
    throw TypeError("values: expected a list or tuple of numbers, got " +
                    std::string(py::str(py::type::of(values_obj).attr("__name__"))));
  }
  const auto values = py::reinterpret_borrow<py::sequence>(values_obj);
  const int count = static_cast<int>(py::len(values));
  if (count < 1 || count > kernels::kMaxScalars) {
    throw ValueError("values: expected 1 to " + std::to_string(kernels::kMaxScalars) + " numbers, got " +
                     std::to_string(count));
  }
  std::vector<float> host(count);
  for (int i = 0; i < count; ++i) {
    const std::string name = "values[" + std::to_string(i) + "]";
    host[i] = static_cast<float>(number_arg(values[i], name.c_str()));
  }
  OpArgs args("write_scalars");
  TensorArgOptions one_d;
  one_d.ndim = 1;
  one_d.writable = true;
  const TensorView& dst = args.input(dst_obj, "dst", DType::F32, one_d);
  check_shape(dst, "dst", {count});
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::write_scalars(static_cast<float*>(dst.data), host.data(), count, stream_arg(stream));
}

void advance_step_op(py::handle step_obj, py::handle found_inf_obj, uintptr_t stream) {
  OpArgs args("advance_step");
  const TensorView& step = one_element_arg(args, step_obj, "step", DType::F32, /*writable=*/true);
  const int32_t* found_inf = nullptr;
  if (!found_inf_obj.is_none()) {
    found_inf = static_cast<const int32_t*>(one_element_arg(args, found_inf_obj, "found_inf", DType::I32, false).data);
  }
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::advance_step(static_cast<float*>(step.data), found_inf, stream_arg(stream));
}

void update_loss_scale_op(py::handle scale_obj, py::handle tracker_obj, py::handle found_inf_obj, py::handle growth_obj,
                          py::handle backoff_obj, py::handle interval_obj, uintptr_t stream) {
  const double growth = number_arg(growth_obj, "growth_factor");
  if (!(growth > 1.0)) throw ValueError("growth_factor: expected > 1, got " + std::to_string(growth));
  const double backoff = check_range(number_arg(backoff_obj, "backoff_factor"), "backoff_factor", 0.0, 1.0);
  if (backoff == 0.0) throw ValueError("backoff_factor: expected a value in (0, 1), got 0");
  const int interval = int32_arg(interval_obj, "growth_interval");
  if (interval < 1) throw ValueError("growth_interval: expected an int >= 1, got " + std::to_string(interval));
  OpArgs args("update_loss_scale");
  const TensorView& scale = one_element_arg(args, scale_obj, "scale", DType::F32, /*writable=*/true);
  const TensorView& tracker = one_element_arg(args, tracker_obj, "tracker", DType::I32, /*writable=*/true);
  const TensorView& found_inf = one_element_arg(args, found_inf_obj, "found_inf", DType::I32, false);
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::update_loss_scale(static_cast<float*>(scale.data), static_cast<int32_t*>(tracker.data),
                             static_cast<const int32_t*>(found_inf.data), static_cast<float>(growth),
                             static_cast<float>(backoff), interval, stream_arg(stream));
}

void reciprocal_scale_op(py::handle scale_obj, py::handle inv_scale_obj, uintptr_t stream) {
  OpArgs args("reciprocal_scale");
  const TensorView& scale = one_element_arg(args, scale_obj, "scale", DType::F32, false);
  const TensorView& inv_scale = one_element_arg(args, inv_scale_obj, "inv_scale", DType::F32, /*writable=*/true);
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::reciprocal_scale(static_cast<const float*>(scale.data), static_cast<float*>(inv_scale.data),
                            stream_arg(stream));
}

}  // namespace

void bind_device_scalars(py::module_& m) {
  m.def("write_scalars", &write_scalars_op, py::arg("dst"), py::arg("values"), py::arg("stream"),
        "dst[:] = values (1 to 8 numbers) on the device, passed as kernel arguments; dst float32 (len(values),).");
  m.def("advance_step", &advance_step_op, py::arg("step"), py::arg("found_inf"), py::arg("stream"),
        "step[0] += 1 unless found_inf[0] != 0 (found_inf may be None).");
  m.def("update_loss_scale", &update_loss_scale_op, py::arg("scale"), py::arg("tracker"), py::arg("found_inf"),
        py::arg("growth_factor"), py::arg("backoff_factor"), py::arg("growth_interval"), py::arg("stream"),
        "GradScaler's update of the float32 (1,) scale and int32 (1,) tracker from the int32 (1,) found_inf.");
  m.def("reciprocal_scale", &reciprocal_scale_op, py::arg("scale"), py::arg("inv_scale"), py::arg("stream"),
        "inv_scale[0] = 1 / scale[0] (float32 (1,) device arrays).");
}

}  // namespace rn
