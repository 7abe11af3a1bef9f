// Python bindings of the softmax cross-entropy kernels (csrc/kernels/cross_entropy.h); resnet_native/losses.py
// wraps them. Outputs are given by the caller (the loss object's buffers): shape (1,) each, optional, at least one.
#include <pybind11/pybind11.h>

#include <string>

#include "../core/error.h"
#include "../kernels/cross_entropy.h"
#include "bindings.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

struct LossInputs {
  const TensorView& logits;
  const TensorView& labels;
  float smoothing;
};

// logits fp32 (N, C), labels int32 (N,), label_smoothing in [0, 1).
LossInputs loss_inputs(OpArgs& args, py::handle logits_obj, py::handle labels_obj, py::handle smoothing_obj) {
  const float smoothing =
      static_cast<float>(check_range(number_arg(smoothing_obj, "label_smoothing"), "label_smoothing", 0.0, 1.0));
  TensorArgOptions two_d;
  two_d.ndim = 2;
  two_d.int32_dims = true;
  const TensorView& logits = args.input(logits_obj, "logits", DType::F32, two_d);
  TensorArgOptions one_d;
  one_d.ndim = 1;
  const TensorView& labels = args.input(labels_obj, "labels", DType::I32, one_d);
  check_shape(labels, "labels", {logits.shape[0]});
  return {logits, labels, smoothing};
}

// An optional (1,) output of `dtype`, disjoint from the inputs.
const TensorView& scalar_output(OpArgs& args, py::handle obj, const char* name, DType dtype, const LossInputs& in) {
  if (obj.is_none()) return args.optional_output(obj, name, dtype);  // undefined: not wanted
  const TensorView& v = one_element_arg(args, obj, name, dtype, /*writable=*/true);
  check_disjoint(v, name, {{in.logits, "logits"}, {in.labels, "labels"}});
  return v;
}

void forward_op(py::handle logits_obj, py::handle labels_obj, py::handle smoothing_obj, py::handle loss_obj,
                py::handle correct_obj, py::handle loss_sum_obj, py::handle correct_sum_obj, uintptr_t stream) {
  OpArgs args("cross_entropy_forward");
  const LossInputs in = loss_inputs(args, logits_obj, labels_obj, smoothing_obj);
  const NamedView outputs[] = {{scalar_output(args, loss_obj, "loss", DType::F32, in), "loss"},
                               {scalar_output(args, correct_obj, "correct", DType::I32, in), "correct"},
                               {scalar_output(args, loss_sum_obj, "loss_sum", DType::F64, in), "loss_sum"},
                               {scalar_output(args, correct_sum_obj, "correct_sum", DType::F64, in), "correct_sum"}};
  bool any = false;
  for (size_t i = 0; i < 4; ++i) {
    any = any || outputs[i].view.defined();
    for (size_t j = 0; j < i; ++j) {
      if (overlaps(outputs[i].view, outputs[j].view)) {
        throw ValueError(std::string(outputs[i].name) + " must not share memory with " + outputs[j].name);
      }
    }
  }
  if (!any) throw ValueError("loss, correct, loss_sum, correct_sum: expected at least one output array, all are None");
  args.prepare_device();
  kernels::CrossEntropyOutputs out;
  out.mean_loss = static_cast<float*>(outputs[0].view.data);
  out.correct = static_cast<int32_t*>(outputs[1].view.data);
  out.loss_sum = static_cast<double*>(outputs[2].view.data);
  out.correct_sum = static_cast<double*>(outputs[3].view.data);
  OpContext context(&OpArgs::describe, &args);
  kernels::cross_entropy_forward(in.logits, in.labels, in.smoothing, out, stream_arg(stream));
}

py::object backward_op(py::handle logits_obj, py::handle labels_obj, py::handle smoothing_obj, py::handle scale_obj,
                       py::handle grad_obj, uintptr_t stream) {
  OpArgs args("cross_entropy_backward");
  const LossInputs in = loss_inputs(args, logits_obj, labels_obj, smoothing_obj);
  const kernels::ScalarArg scale =
      scale_obj.is_none() ? kernels::ScalarArg{1.0f, nullptr} : scalar_arg(args, scale_obj, "scale");
  const TensorView& grad = args.output(grad_obj, "grad", DType::F32, shape_of(in.logits));
  check_same_shape(grad, "grad", in.logits, "logits");
  check_in_place_or_disjoint(grad, "grad", in.logits, "logits");
  check_disjoint(grad, "grad", {{in.labels, "labels"}});
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::cross_entropy_backward(in.logits, in.labels, in.smoothing, scale, grad, stream_arg(stream));
  return args.object(grad);
}

}  // namespace

void bind_loss(py::module_& m) {
  m.def("cross_entropy_forward", &forward_op, py::arg("logits"), py::arg("labels"), py::arg("label_smoothing"),
        py::arg("loss"), py::arg("correct"), py::arg("loss_sum"), py::arg("correct_sum"), py::arg("stream"),
        "Softmax cross-entropy of fp32 logits (N, C) against int32 labels (N,), into the (1,) outputs given: "
        "loss = the mean (float32), correct = the argmax hits (int32), loss_sum / correct_sum += the sums (float64).");
  m.def("cross_entropy_backward", &backward_op, py::arg("logits"), py::arg("labels"), py::arg("label_smoothing"),
        py::arg("scale"), py::arg("grad"), py::arg("stream"),
        "grad = (softmax(logits) - target) * scale / N (scale: None, a number or a float32 (1,) device array); "
        "returns grad (allocated when None).");
}

}  // namespace rn
