// Python bindings of the custom CUDA kernels: the residual-block elementwise ops, dtype conversion, the
// cudnnAddTensor baseline, and the multi-tensor optimizer kernels with their device tables (TensorTable).
// resnet_native/kernels.py and resnet_native/multi_tensor.py wrap these; they allocate outputs before calling.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "../core/error.h"
#include "../kernels/add_tensor_cudnn.h"
#include "../kernels/cast.h"
#include "../kernels/elementwise.h"
#include "../kernels/multi_tensor.h"
#include "../kernels/op_args.h"
#include "../kernels/tensor_table.h"
#include "bindings.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace rn {
namespace {

using kernels::ScalarArg;
using kernels::TensorTable;

enum class Binary { Add, AddRelu, ReluBackward };

// out = op(first, second): add / add_relu (a, b) and the ReLU mask (dy, y).
void binary_op(const char* op, Binary kind, py::handle first_obj, py::handle second_obj, py::handle out_obj,
               const std::string& dtype_name, uintptr_t stream) {
  const DType dtype = parse_dtype(dtype_name);
  const bool mask = kind == Binary::ReluBackward;
  const char* first_name = mask ? "dy" : "a";
  const char* second_name = mask ? "y" : "b";
  OpArgs args(op);
  const TensorView& first = args.array(first_obj, first_name, dtype);
  const TensorView& second = args.array(second_obj, second_name, dtype);
  const TensorView& out = args.array(out_obj, "out", dtype);
  check_same_shape(first, first_name, second, second_name);
  check_same_shape(out, "out", first, first_name);
  check_in_place_or_disjoint(out, "out", first, first_name);
  check_in_place_or_disjoint(out, "out", second, second_name);
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  if (mask) {
    kernels::relu_backward(first, second, out, stream_arg(stream));
  } else {
    kernels::add(first, second, out, kind == Binary::AddRelu, stream_arg(stream));
  }
}

void relu_op(py::handle x_obj, py::handle out_obj, const std::string& dtype_name, uintptr_t stream) {
  const DType dtype = parse_dtype(dtype_name);
  OpArgs args("relu");
  const TensorView& x = args.array(x_obj, "x", dtype);
  const TensorView& out = args.array(out_obj, "out", dtype);
  check_same_shape(out, "out", x, "x");
  check_in_place_or_disjoint(out, "out", x, "x");
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::relu(x, out, stream_arg(stream));
}

void cast_op(py::handle x_obj, py::handle out_obj, const std::string& x_dtype, const std::string& out_dtype,
             uintptr_t stream) {
  OpArgs args("cast");
  const TensorView& x = args.array(x_obj, "x", parse_dtype(x_dtype));
  const TensorView& out = args.array(out_obj, "out", parse_dtype(out_dtype));
  check_same_shape(out, "out", x, "x");
  check_in_place_or_disjoint(out, "out", x, "x");
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::cast(x, out, stream_arg(stream));
}

void add_tensor_cudnn_op(py::handle a_obj, py::handle b_obj, py::handle out_obj, const std::string& layout_name,
                         const std::string& dtype_name, uintptr_t stream) {
  const Layout layout = parse_layout(layout_name);
  const DType dtype = parse_dtype(dtype_name);
  OpArgs args("add_tensor_cudnn");
  const TensorView& a = args.array(a_obj, "a", dtype, 4);
  const TensorView& b = args.array(b_obj, "b", dtype, 4);
  const TensorView& out = args.array(out_obj, "out", dtype, 4);
  check_same_shape(a, "a", b, "b");
  check_same_shape(out, "out", a, "a");
  check_in_place_or_disjoint(out, "out", a, "a");
  check_in_place_or_disjoint(out, "out", b, "b");
  args.set_note(std::string("layout=") + layout_name);
  args.check_on_device();
  OpContext context(&OpArgs::describe, &args);
  kernels::add_tensor_cudnn(a, b, out, layout, stream_arg(stream));
}

// ---- multi-tensor ----

std::unique_ptr<TensorTable> make_table(const py::sequence& arrays, const py::sequence& dtypes) {
  if (py::len(arrays) != py::len(dtypes)) throw ValueError("dtypes: expected one dtype per array");
  if (py::len(arrays) == 0) throw ValueError("arrays: expected at least one array");
  std::vector<std::string> names;  // outlives `args`, which keeps pointers to these strings
  names.reserve(py::len(arrays));
  for (size_t i = 0; i < py::len(arrays); ++i) names.push_back("arrays[" + std::to_string(i) + "]");
  OpArgs args("TensorList");
  std::vector<TensorView> views;
  for (size_t i = 0; i < py::len(arrays); ++i) {
    py::handle obj = arrays[i];
    if (obj.is_none()) {
      views.emplace_back();
      continue;
    }
    views.push_back(args.array(obj, names[i].c_str(), parse_dtype(py::str(dtypes[i]))));
  }
  args.check_on_device();
  return std::make_unique<TensorTable>(std::move(views));
}

// A number, or a float32 device array of shape (1,) read by the kernel.
ScalarArg scalar_arg(OpArgs& args, py::handle obj, const char* name) {
  ScalarArg s;
  if (py::hasattr(obj, "__cuda_array_interface__") || py::hasattr(obj, "__dlpack__")) {
    const TensorView& v = args.array(obj, name, DType::F32, 1);
    check_shape(v, name, {1});
    s.ptr = static_cast<const float*>(v.data);
  } else {
    try {
      s.value = obj.cast<float>();
    } catch (const py::cast_error&) {
      throw TypeError(std::string(name) + ": expected a number or a float32 device array of shape (1,), got " +
                      std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
  }
  return s;
}

// found_inf arrives as a float32 view of the caller's int32 (1,) array (the Python wrapper checked its dtype).
int32_t* found_inf_arg(OpArgs& args, py::handle obj) {
  if (obj.is_none()) return nullptr;
  const TensorView& v = args.array(obj, "found_inf", DType::F32, 1);
  check_shape(v, "found_inf", {1});
  return static_cast<int32_t*>(v.data);
}

const TensorTable* optional_table(py::handle obj) {
  return obj.is_none() ? nullptr : obj.cast<const TensorTable*>();
}

void sgd_op(const TensorTable& params, const TensorTable& grads, py::handle bufs_obj, py::handle copies_obj,
            py::handle lr_obj, py::handle inv_scale_obj, py::handle found_inf_obj, py::handle momentum_obj,
            float dampening, float weight_decay, bool nesterov, bool first_step, uintptr_t stream) {
  const TensorTable* bufs = optional_table(bufs_obj);
  const TensorTable* copies = optional_table(copies_obj);
  OpArgs args("sgd_step");
  const ScalarArg lr = scalar_arg(args, lr_obj, "lr");
  const ScalarArg inv_scale = scalar_arg(args, inv_scale_obj, "inv_scale");
  const ScalarArg momentum = scalar_arg(args, momentum_obj, "momentum");
  const int32_t* found_inf = found_inf_arg(args, found_inf_obj);
  if ((momentum.ptr || momentum.value != 0.0f) && !bufs) {
    throw ValueError("momentum_bufs: required when momentum is a device array or != 0");
  }
  args.check_on_device();
  kernels::check_table(params, "params", nullptr, nullptr, false);
  kernels::check_table_dtype(params, "params", DType::F32);
  kernels::check_table(grads, "grads", &params, "params", false);
  if (bufs) {
    kernels::check_table(*bufs, "momentum_bufs", &params, "params", false);
    kernels::check_table_dtype(*bufs, "momentum_bufs", DType::F32);
  }
  if (copies) kernels::check_table(*copies, "model_copies", &params, "params", true);
  OpContext context(&OpArgs::describe, &args);
  kernels::SgdOptions options;
  options.dampening = dampening;
  options.weight_decay = weight_decay;
  options.nesterov = nesterov;
  options.first_step = first_step;
  kernels::sgd_step(params, grads, bufs, copies, lr, inv_scale, momentum, found_inf, options, stream_arg(stream));
}

void adamw_op(const TensorTable& params, const TensorTable& grads, const TensorTable& exp_avgs,
              const TensorTable& exp_avg_sqs, py::handle copies_obj, py::handle lr_obj, py::handle inv_scale_obj,
              py::handle step_obj, py::handle found_inf_obj, py::handle beta1_obj, float beta2, float eps,
              float weight_decay, uintptr_t stream) {
  const TensorTable* copies = optional_table(copies_obj);
  OpArgs args("adamw_step");
  const ScalarArg lr = scalar_arg(args, lr_obj, "lr");
  const ScalarArg inv_scale = scalar_arg(args, inv_scale_obj, "inv_scale");
  const ScalarArg step = scalar_arg(args, step_obj, "step");
  const ScalarArg beta1 = scalar_arg(args, beta1_obj, "beta1");
  const int32_t* found_inf = found_inf_arg(args, found_inf_obj);
  args.check_on_device();
  kernels::check_table(params, "params", nullptr, nullptr, false);
  kernels::check_table_dtype(params, "params", DType::F32);
  kernels::check_table(grads, "grads", &params, "params", false);
  kernels::check_table(exp_avgs, "exp_avgs", &params, "params", false);
  kernels::check_table_dtype(exp_avgs, "exp_avgs", DType::F32);
  kernels::check_table(exp_avg_sqs, "exp_avg_sqs", &params, "params", false);
  kernels::check_table_dtype(exp_avg_sqs, "exp_avg_sqs", DType::F32);
  if (copies) kernels::check_table(*copies, "model_copies", &params, "params", true);
  OpContext context(&OpArgs::describe, &args);
  kernels::AdamWOptions options;
  options.beta2 = beta2;
  options.eps = eps;
  options.weight_decay = weight_decay;
  kernels::adamw_step(params, grads, exp_avgs, exp_avg_sqs, copies, lr, inv_scale, step, beta1, found_inf, options,
                      stream_arg(stream));
}

void check_finite_op(const TensorTable& tensors, py::handle found_inf_obj, uintptr_t stream) {
  OpArgs args("check_finite");
  int32_t* found_inf = found_inf_arg(args, found_inf_obj);
  if (!found_inf) throw TypeError("found_inf: expected a CUDA array, got None");
  args.check_on_device();
  kernels::check_table(tensors, "grads", nullptr, nullptr, false);
  OpContext context(&OpArgs::describe, &args);
  kernels::check_finite(tensors, found_inf, stream_arg(stream));
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def(
      "add",
      [](py::handle a, py::handle b, py::handle out, const std::string& dtype, uintptr_t stream) {
        binary_op("add", Binary::Add, a, b, out, dtype, stream);
      },
      py::arg("a"), py::arg("b"), py::arg("out"), py::arg("dtype"), py::arg("stream"), "out = a + b");
  m.def(
      "add_relu",
      [](py::handle a, py::handle b, py::handle out, const std::string& dtype, uintptr_t stream) {
        binary_op("add_relu", Binary::AddRelu, a, b, out, dtype, stream);
      },
      py::arg("a"), py::arg("b"), py::arg("out"), py::arg("dtype"), py::arg("stream"), "out = max(a + b, 0)");
  m.def(
      "relu_backward",
      [](py::handle dy, py::handle y, py::handle out, const std::string& dtype, uintptr_t stream) {
        binary_op("relu_backward", Binary::ReluBackward, dy, y, out, dtype, stream);
      },
      py::arg("dy"), py::arg("y"), py::arg("out"), py::arg("dtype"), py::arg("stream"), "out = dy * (y > 0)");
  m.def("relu", &relu_op, py::arg("x"), py::arg("out"), py::arg("dtype"), py::arg("stream"), "out = max(x, 0)");
  m.def("cast", &cast_op, py::arg("x"), py::arg("out"), py::arg("x_dtype"), py::arg("out_dtype"), py::arg("stream"),
        "out = x converted to out's dtype (round to nearest even)");
  m.def("add_tensor_cudnn", &add_tensor_cudnn_op, py::arg("a"), py::arg("b"), py::arg("out"), py::arg("layout"),
        py::arg("dtype"), py::arg("stream"), "out = a + b through cudnnAddTensor");

  py::class_<TensorTable>(m, "TensorTable",
                          "Device table (pointers, sizes, dtypes, chunks) of a list of arrays, for the multi-tensor "
                          "kernels. Holds no reference to the arrays: resnet_native.multi_tensor.TensorList does.")
      .def(py::init(&make_table), py::arg("arrays"), py::arg("dtypes"))
      .def("__len__", &TensorTable::size)
      .def_property_readonly("numels",
                             [](const TensorTable& t) {
                               py::list out;
                               for (const auto& v : t.entries()) {
                                 out.append(v.defined() ? py::object(py::int_(v.numel())) : py::object(py::none()));
                               }
                               return out;
                             })
      .def_property_readonly("num_chunks", [](const TensorTable& t) { return t.chunks().count; })
      .def_property_readonly("device", &TensorTable::device);

  m.def("multi_tensor_sgd", &sgd_op, py::arg("params"), py::arg("grads"), py::arg("momentum_bufs"),
        py::arg("model_copies"), py::arg("lr"), py::arg("inv_scale"), py::arg("found_inf"), py::arg("momentum"),
        py::arg("dampening"), py::arg("weight_decay"), py::arg("nesterov"), py::arg("first_step"), py::arg("stream"));
  m.def("multi_tensor_adamw", &adamw_op, py::arg("params"), py::arg("grads"), py::arg("exp_avgs"),
        py::arg("exp_avg_sqs"), py::arg("model_copies"), py::arg("lr"), py::arg("inv_scale"), py::arg("step"),
        py::arg("found_inf"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
        py::arg("stream"));
  m.def("multi_tensor_check_finite", &check_finite_op, py::arg("tensors"), py::arg("found_inf"), py::arg("stream"));
  m.def(
      "multi_tensor_zero",
      [](const TensorTable& tensors, uintptr_t stream) {
        kernels::check_table(tensors, "tensors", nullptr, nullptr, false);
        kernels::zero(tensors, stream_arg(stream));
      },
      py::arg("tensors"), py::arg("stream"));
  m.def(
      "multi_tensor_scale",
      [](const TensorTable& tensors, py::handle factor_obj, uintptr_t stream) {
        OpArgs args("scale_");
        const ScalarArg factor = scalar_arg(args, factor_obj, "factor");
        args.check_on_device();
        kernels::check_table(tensors, "tensors", nullptr, nullptr, false);
        kernels::scale(tensors, factor, stream_arg(stream));
      },
      py::arg("tensors"), py::arg("factor"), py::arg("stream"));
}

}  // namespace rn
