// Python bindings of the multi-tensor optimizer kernels and their device tables (TensorTable);
// resnet_native/multi_tensor.py wraps them. Every argument is checked here, in this order: the hyperparameters
// (numbers range-checked; a device scalar cannot be, a captured graph reads its value at each replay), the
// device scalars and found_inf, the tables' types, then the device, then the tables against each other.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "../core/error.h"
#include "../kernels/multi_tensor.h"
#include "../kernels/tensor_table.h"
#include "array_sources.h"
#include "bindings.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

using kernels::ScalarArg;
using kernels::TensorTable;

// dtype: None (inferred per array), one dtype for all, or a list / tuple of one per array (None entries infer).
std::unique_ptr<TensorTable> make_table(const py::sequence& arrays, py::handle dtype, int64_t chunk_elements) {
  const size_t n = py::len(arrays);
  if (n == 0) throw ValueError("arrays: expected at least one array");
  if (chunk_elements < 1 || chunk_elements > (int64_t{1} << 30)) {
    throw ValueError("chunk_elements: expected a whole number from 1 to 2**30, got " + std::to_string(chunk_elements));
  }
  const bool per_array = PyList_Check(dtype.ptr()) || PyTuple_Check(dtype.ptr());
  if (per_array && py::len(dtype) != n) {
    throw ValueError("dtype: expected " + std::to_string(n) + " dtypes (one per array), got " +
                     std::to_string(py::len(dtype)));
  }
  const DTypeRequest shared = per_array ? DTypeRequest::infer() : dtype_arg(dtype);
  std::vector<std::string> names;  // outlives `args`, which keeps pointers to these strings
  names.reserve(n);
  for (size_t i = 0; i < n; ++i) names.push_back("arrays[" + std::to_string(i) + "]");
  OpArgs args("TensorList");
  std::vector<const TensorView*> views;
  for (size_t i = 0; i < n; ++i) {
    const DTypeRequest request = per_array ? dtype_arg(py::reinterpret_borrow<py::sequence>(dtype)[i]) : shared;
    views.push_back(&args.optional_input(arrays[i], names[i].c_str(), request));  // None: an absent entry
  }
  args.prepare_device();
  std::vector<TensorView> entries;
  for (const TensorView* v : views) entries.push_back(*v);
  return std::make_unique<TensorTable>(std::move(entries), chunk_elements);
}

// A resnet_native.multi_tensor.TensorList's table (the wrapper passes its _table, anything else as is).
const TensorTable* table_arg(py::handle obj, const char* name, bool optional) {
  if (optional && obj.is_none()) return nullptr;
  if (!py::isinstance<TensorTable>(obj)) {
    throw TypeError(std::string(name) + ": expected a resnet_native.multi_tensor.TensorList (built once), got " +
                    std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  return obj.cast<const TensorTable*>();
}

// A scalar whose host value must lie in [low, high) (high < 0: no upper bound).
ScalarArg ranged_scalar_arg(OpArgs& args, py::handle obj, const char* name, double low, double high) {
  const ScalarArg s = scalar_arg(args, obj, name);
  if (!s.ptr) {
    const double value = number_arg(obj, name);
    if (high < 0) {
      check_at_least(value, name, low);
    } else {
      check_range(value, name, low, high);
    }
  }
  return s;
}

double non_negative_arg(py::handle obj, const char* name) {
  return check_at_least(number_arg(obj, name), name, 0.0);
}

// found_inf: an int32 device array of shape (1,), read (and by check_finite written) by the kernel.
int32_t* found_inf_arg(OpArgs& args, py::handle obj, bool required, bool written) {
  if (obj.is_none() && !required) return nullptr;
  return static_cast<int32_t*>(one_element_arg(args, obj, "found_inf", DType::I32, written).data);
}

// The table checks every update shares: params fp32, each state table fp32 and the size of params, grads the
// size of params, copies (absent entries allowed) the size of params; every table the kernel writes writable.
void check_update_tables(const TensorTable& params, const TensorTable& grads,
                         std::initializer_list<std::pair<const TensorTable*, const char*>> state,
                         const TensorTable* copies) {
  kernels::check_table(params, "params", nullptr, nullptr, false);
  kernels::check_table_dtype(params, "params", DType::F32);
  kernels::check_table_writable(params, "params");
  kernels::check_table(grads, "grads", &params, "params", false);
  for (const auto& [table, name] : state) {
    if (!table) continue;
    kernels::check_table(*table, name, &params, "params", false);
    kernels::check_table_dtype(*table, name, DType::F32);
    kernels::check_table_writable(*table, name);
  }
  if (copies) {
    kernels::check_table(*copies, "model_copies", &params, "params", true);
    kernels::check_table_writable(*copies, "model_copies");
  }
}

void sgd_op(py::handle params_obj, py::handle grads_obj, py::handle bufs_obj, py::handle copies_obj, py::handle lr_obj,
            py::handle inv_scale_obj, py::handle found_inf_obj, py::handle momentum_obj, py::handle dampening_obj,
            py::handle weight_decay_obj, bool nesterov, bool first_step, uintptr_t stream) {
  OpArgs args("sgd_step");
  const ScalarArg momentum = ranged_scalar_arg(args, momentum_obj, "momentum", 0.0, -1.0);
  kernels::SgdOptions options;
  options.dampening = static_cast<float>(non_negative_arg(dampening_obj, "dampening"));
  options.weight_decay = static_cast<float>(non_negative_arg(weight_decay_obj, "weight_decay"));
  options.nesterov = nesterov;
  options.first_step = first_step;
  if (nesterov && ((!momentum.ptr && momentum.value == 0.0f) || options.dampening != 0.0f)) {
    throw ValueError("nesterov: needs momentum > 0 and dampening == 0");
  }
  const ScalarArg lr = scalar_arg(args, lr_obj, "lr");
  const ScalarArg inv_scale = scalar_arg(args, inv_scale_obj, "inv_scale");
  const int32_t* found_inf = found_inf_arg(args, found_inf_obj, false, false);
  const TensorTable& params = *table_arg(params_obj, "params", false);
  const TensorTable& grads = *table_arg(grads_obj, "grads", false);
  const TensorTable* bufs = table_arg(bufs_obj, "momentum_bufs", true);
  const TensorTable* copies = table_arg(copies_obj, "model_copies", true);
  if ((momentum.ptr || momentum.value != 0.0f) && !bufs) {
    throw ValueError("momentum_bufs: required when momentum is a device array or != 0");
  }
  args.prepare_device();
  check_update_tables(params, grads, {{bufs, "momentum_bufs"}}, copies);
  OpContext context(&OpArgs::describe, &args);
  kernels::sgd_step(params, grads, bufs, copies, lr, inv_scale, momentum, found_inf, options, stream_arg(stream));
}

void adamw_op(py::handle params_obj, py::handle grads_obj, py::handle exp_avgs_obj, py::handle exp_avg_sqs_obj,
              py::handle copies_obj, py::handle lr_obj, py::handle inv_scale_obj, py::handle step_obj,
              py::handle found_inf_obj, py::handle beta1_obj, py::handle beta2_obj, py::handle eps_obj,
              py::handle weight_decay_obj, uintptr_t stream) {
  OpArgs args("adamw_step");
  const ScalarArg beta1 = ranged_scalar_arg(args, beta1_obj, "beta1", 0.0, 1.0);
  kernels::AdamWOptions options;
  options.beta2 = static_cast<float>(check_range(number_arg(beta2_obj, "beta2"), "beta2", 0.0, 1.0));
  options.eps = static_cast<float>(non_negative_arg(eps_obj, "eps"));
  options.weight_decay = static_cast<float>(non_negative_arg(weight_decay_obj, "weight_decay"));
  const ScalarArg step = scalar_arg(args, step_obj, "step");
  if (!step.ptr && !(number_arg(step_obj, "step") >= 1.0)) {
    throw ValueError("step: expected the 1-based step number, got " + std::string(py::repr(step_obj)));
  }
  const ScalarArg lr = scalar_arg(args, lr_obj, "lr");
  const ScalarArg inv_scale = scalar_arg(args, inv_scale_obj, "inv_scale");
  const int32_t* found_inf = found_inf_arg(args, found_inf_obj, false, false);
  const TensorTable& params = *table_arg(params_obj, "params", false);
  const TensorTable& grads = *table_arg(grads_obj, "grads", false);
  const TensorTable& exp_avgs = *table_arg(exp_avgs_obj, "exp_avgs", false);
  const TensorTable& exp_avg_sqs = *table_arg(exp_avg_sqs_obj, "exp_avg_sqs", false);
  const TensorTable* copies = table_arg(copies_obj, "model_copies", true);
  args.prepare_device();
  check_update_tables(params, grads, {{&exp_avgs, "exp_avgs"}, {&exp_avg_sqs, "exp_avg_sqs"}}, copies);
  OpContext context(&OpArgs::describe, &args);
  kernels::adamw_step(params, grads, exp_avgs, exp_avg_sqs, copies, lr, inv_scale, step, beta1, found_inf, options,
                      stream_arg(stream));
}

void check_finite_op(py::handle tensors_obj, py::handle found_inf_obj, uintptr_t stream) {
  OpArgs args("check_finite");
  int32_t* found_inf = found_inf_arg(args, found_inf_obj, /*required=*/true, /*written=*/true);
  const TensorTable& tensors = *table_arg(tensors_obj, "grads", false);
  args.prepare_device();
  kernels::check_table(tensors, "grads", nullptr, nullptr, false);
  OpContext context(&OpArgs::describe, &args);
  kernels::check_finite(tensors, found_inf, stream_arg(stream));
}

void zero_op(py::handle tensors_obj, uintptr_t stream) {
  const TensorTable& tensors = *table_arg(tensors_obj, "tensors", false);
  kernels::check_table(tensors, "tensors", nullptr, nullptr, false);
  kernels::check_table_writable(tensors, "tensors");
  kernels::zero(tensors, stream_arg(stream));
}

void scale_op(py::handle tensors_obj, py::handle factor_obj, uintptr_t stream) {
  OpArgs args("scale_");
  const ScalarArg factor = scalar_arg(args, factor_obj, "factor");
  const TensorTable& tensors = *table_arg(tensors_obj, "tensors", false);
  args.prepare_device();
  kernels::check_table(tensors, "tensors", nullptr, nullptr, false);
  kernels::check_table_writable(tensors, "tensors");
  kernels::scale(tensors, factor, stream_arg(stream));
}

}  // namespace

void bind_multi_tensor(py::module_& m) {
  py::class_<TensorTable>(m, "TensorTable",
                          "Device table (pointers, sizes, dtypes, chunks) of a list of arrays, for the multi-tensor "
                          "kernels. Holds no reference to the arrays: resnet_native.multi_tensor.TensorList does.")
      .def(py::init(&make_table), py::arg("arrays"), py::arg("dtype") = py::none(),
           py::arg("chunk_elements") = kernels::kMultiTensorChunk)
      .def("__len__", &TensorTable::size)
      .def_property_readonly("numels",
                             [](const TensorTable& t) {
                               py::list out;
                               for (const auto& v : t.entries()) {
                                 out.append(v.defined() ? py::object(py::int_(v.numel())) : py::object(py::none()));
                               }
                               return out;
                             })
      .def_property_readonly(
          "dtypes",
          [](const TensorTable& t) {
            py::list out;
            for (const auto& v : t.entries()) {
              out.append(v.defined() ? py::object(py::str(dtype_short_name(v.dtype))) : py::object(py::none()));
            }
            return out;
          })
      .def_property_readonly("num_chunks", [](const TensorTable& t) { return t.chunks().count; })
      .def_property_readonly("device", &TensorTable::device);

  m.attr("MULTI_TENSOR_CHUNK") = kernels::kMultiTensorChunk;
  m.def("multi_tensor_sgd", &sgd_op, py::arg("params"), py::arg("grads"), py::arg("momentum_bufs"),
        py::arg("model_copies"), py::arg("lr"), py::arg("inv_scale"), py::arg("found_inf"), py::arg("momentum"),
        py::arg("dampening"), py::arg("weight_decay"), py::arg("nesterov"), py::arg("first_step"), py::arg("stream"));
  m.def("multi_tensor_adamw", &adamw_op, py::arg("params"), py::arg("grads"), py::arg("exp_avgs"),
        py::arg("exp_avg_sqs"), py::arg("model_copies"), py::arg("lr"), py::arg("inv_scale"), py::arg("step"),
        py::arg("found_inf"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
        py::arg("stream"));
  m.def("multi_tensor_check_finite", &check_finite_op, py::arg("tensors"), py::arg("found_inf"), py::arg("stream"));
  m.def("multi_tensor_zero", &zero_op, py::arg("tensors"), py::arg("stream"));
  m.def("multi_tensor_scale", &scale_op, py::arg("tensors"), py::arg("factor"), py::arg("stream"));
}

}  // namespace rn
