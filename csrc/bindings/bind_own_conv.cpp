// Python bindings of the own-kernel convolutions (csrc/ownconv/; resnet_native/ops/own_conv.py wraps them): the
// registry's listing, the kernel choice (host only), and the int8 convolution with its requantising epilogue.
// Arguments go through OpArgs / tensor_arg / value_args as every op's do, so each error names its argument and is
// raised before the device is touched.
#include <pybind11/pybind11.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "../core/error.h"
#include "../ownconv/own_conv.h"
#include "../ownconv/registry.h"
#include "../ownconv/run.h"
#include "../ownconv/select.h"
#include "bindings.h"
#include "op_args.h"
#include "tensor_arg.h"
#include "value_args.h"

namespace py = pybind11;

namespace rn {
namespace {

using ownconv::ConvProblem;
using ownconv::Epilogue;

// The problem of x (N, H, W, C) and w (K, R, S, C) shapes; ValueError for C mismatch, a bad pad / stride or an
// empty output.
ConvProblem make_problem(const int64_t* x, const int64_t* w, py::handle pad_obj, py::handle stride_obj,
                         const char* w_name) {
  const std::array<int, 2> pad = int_pair_arg(pad_obj, "pad");
  const std::array<int, 2> stride = int_pair_arg(stride_obj, "stride");
  if (pad[0] < 0 || pad[1] < 0) throw ValueError("pad: expected values >= 0");
  if (stride[0] < 1 || stride[1] < 1) throw ValueError("stride: expected values >= 1");
  if (w[3] != x[3]) {
    throw ValueError(std::string(w_name) + ": expected (K, R, S, C) filters with C = " + std::to_string(x[3]) +
                     " (x's channels), got " + shape_text(w, 4));
  }
  ConvProblem p;
  p.n = static_cast<int>(x[0]);
  p.h = static_cast<int>(x[1]);
  p.w = static_cast<int>(x[2]);
  p.c = static_cast<int>(x[3]);
  p.k = static_cast<int>(w[0]);
  p.r = static_cast<int>(w[1]);
  p.s = static_cast<int>(w[2]);
  p.pad_h = pad[0];
  p.pad_w = pad[1];
  p.stride_h = stride[0];
  p.stride_w = stride[1];
  if (int64_t{p.h} + 2 * int64_t{p.pad_h} < p.r || int64_t{p.w} + 2 * int64_t{p.pad_w} < p.s) {
    throw ValueError(std::string(w_name) + ": the filters (" + std::to_string(p.r) + ", " + std::to_string(p.s) +
                     ") are larger than the padded input of x");
  }
  return p;
}

// TMA reads and writes whole 16-byte units from 16-byte aligned addresses.
void check_alignment(const TensorView& view, const char* name, int bytes) {
  if (!view.defined() || view.data == nullptr) return;  // absent, or an output still to be allocated
  const auto address = reinterpret_cast<uintptr_t>(view.data);
  if (address % static_cast<uintptr_t>(bytes) != 0) {
    std::ostringstream text;
    text << name << ": expected an address aligned to " << bytes << " bytes (the kernels' TMA), got 0x" << std::hex
         << address;
    throw ValueError(text.str());
  }
}

py::dict kernel_dict(const ownconv::ConvKernel& kernel) {
  const ownconv::KernelInfo& i = kernel.info();
  py::dict d;
  d["name"] = i.name;
  d["dtype"] = dtype_short_name(i.in);
  d["out_dtype"] = dtype_short_name(i.out);
  d["epilogue"] = ownconv::epilogue_name(i.epilogue);
  d["residual"] = ownconv::has_residual(i.epilogue);
  d["tile"] = py::make_tuple(i.tile_m, i.tile_n, i.tile_k);
  d["cluster"] = py::make_tuple(i.cluster_m, i.cluster_n);
  d["stages"] = i.stages;
  d["persistent"] = i.persistent;
  d["gemm_1x1"] = i.gemm_1x1;
  d["preferred"] = i.preferred;
  d["smem_bytes"] = i.smem_bytes;
  d["threads"] = i.threads;
  d["channel_multiple"] = i.channel_multiple;
  d["address_alignment"] = i.address_alignment;
  d["sm"] = i.sm;
  return d;
}

py::list own_conv_kernels() {
  py::list list;
  for (const ownconv::ConvKernel* kernel : ownconv::kernels()) list.append(kernel_dict(*kernel));
  return list;
}

// The name of the kernel that would run these shapes (`kernel` 'auto' or a name, checked); no GPU needed.
std::string own_conv_select(py::handle x_shape_obj, py::handle w_shape_obj, py::handle pad_obj, py::handle stride_obj,
                            bool residual, const std::string& kernel) {
  const std::vector<int64_t> x = shape_arg(x_shape_obj, "x_shape", 4, "N, H, W, C", true);
  const std::vector<int64_t> w = shape_arg(w_shape_obj, "w_shape", 4, nullptr, true);
  const ConvProblem problem = make_problem(x.data(), w.data(), pad_obj, stride_obj, "w_shape");
  const Epilogue epilogue = residual ? Epilogue::RequantizeResidual : Epilogue::Requantize;
  return ownconv::select_kernel(problem, DType::I8, epilogue, kernel).info().name;
}

// "" when the current GPU runs kernel `name`'s code, else why not (NoGPUError without a GPU).
std::string own_conv_device_mismatch(const std::string& name) {
  const ownconv::ConvKernel* kernel = ownconv::find_kernel(name);
  if (kernel == nullptr) throw ValueError("kernel: no compiled kernel named '" + name + "'");
  return ownconv::device_mismatch(*kernel);
}

// out = sat(rne(clamp(alpha[k] * conv(x, w) + bias[k] [+ beta * residual], lower, 127))), lower 0 with relu, else
// -127: int8 NHWC in and out, fp32 alpha and bias (K,).
py::object own_conv_s8(py::handle x_obj, py::handle w_obj, py::handle out_obj, py::handle alpha_obj,
                       py::handle bias_obj, py::handle pad_obj, py::handle stride_obj, py::handle residual_obj,
                       py::handle beta_obj, bool relu, const std::string& kernel_name, uintptr_t stream) {
  const float beta = static_cast<float>(number_arg(beta_obj, "beta"));  // an fp32 scalar, as alpha and bias are
  if (!std::isfinite(beta)) throw ValueError("beta: expected a finite number (in float32)");
  OpArgs args("own_conv_s8");
  const TensorView& x = args.input(x_obj, "x", DType::I8, activation_options(Layout::NHWC));
  TensorArgOptions filters = rank(4);
  filters.int32_dims = true;
  const TensorView& w = args.input(w_obj, "w", DType::I8, filters);
  const ConvProblem problem = make_problem(x.shape.data(), w.shape.data(), pad_obj, stride_obj, "w");
  const std::vector<int64_t> y_shape{problem.n, problem.p(), problem.q(), problem.k};
  const TensorView& alpha = args.input(alpha_obj, "alpha", DType::F32, rank(1));
  check_shape(alpha, "alpha", {problem.k}, "one per output channel");
  const TensorView& bias = args.input(bias_obj, "bias", DType::F32, rank(1));
  check_shape(bias, "bias", {problem.k}, "one per output channel");
  const TensorView& residual = args.optional_input(residual_obj, "residual", DType::I8, rank(4));
  if (residual.defined()) check_shape(residual, "residual", y_shape, "the convolution's output");
  if (!residual.defined() && beta != 0.f) throw ValueError("beta: a residual scale without a residual");
  const TensorView& out = args.output(out_obj, "out", DType::I8, y_shape, rank(4));
  check_shape(out, "out", y_shape, "the convolution's output");
  check_disjoint(out, "out", {{x, "x"}, {w, "w"}, {alpha, "alpha"}, {bias, "bias"}, {residual, "residual"}});
  for (const NamedView& v : {NamedView{x, "x"}, NamedView{w, "w"}, NamedView{alpha, "alpha"}, NamedView{bias, "bias"},
                             NamedView{residual, "residual"}, NamedView{out, "out"}}) {
    check_alignment(v.view, v.name, 16);
  }
  const Epilogue epilogue = residual.defined() ? Epilogue::RequantizeResidual : Epilogue::Requantize;
  const ownconv::ConvKernel& kernel = ownconv::select_kernel(problem, DType::I8, epilogue, kernel_name);
  args.set_note("pad=(" + std::to_string(problem.pad_h) + ", " + std::to_string(problem.pad_w) + "), stride=(" +
                std::to_string(problem.stride_h) + ", " + std::to_string(problem.stride_w) + ")" +
                (relu ? ", relu" : "") + ", kernel=" + kernel.info().name);
  args.prepare_device();
  OpContext context(&OpArgs::describe, &args);
  ownconv::ConvOperands operands;
  operands.x = x.data;
  operands.w = w.data;
  operands.y = out.data;
  ownconv::EpilogueArgs epi;
  epi.alpha = static_cast<const float*>(alpha.data);
  epi.bias = static_cast<const float*>(bias.data);
  epi.residual = residual.defined() ? residual.data : nullptr;
  epi.beta = beta;
  epi.lower = relu ? 0.f : -127.f;
  ownconv::run(kernel, problem, operands, epi, stream_arg(stream));
  return args.object(out);
}

}  // namespace

py::dict own_conv_build_status() {
  const ownconv::BuildStatus status = ownconv::build_status();
  py::dict d;
  d["built"] = status.built;
  d["reason"] = status.reason;
  d["cutlass"] = status.cutlass_version;
  py::list names;
  for (const ownconv::ConvKernel* kernel : ownconv::kernels()) names.append(kernel->info().name);
  d["kernels"] = names;
  return d;
}

void bind_own_conv(py::module_& m) {
  m.def(
      "own_conv_kernels", &own_conv_kernels,
      "The compiled own convolution kernels: a dict each (name, dtype, epilogue, residual, tile, cluster, stages, "
      "persistent, gemm_1x1, preferred, smem_bytes, threads, channel_multiple, address_alignment, sm); empty when not "
      "built.");
  m.def("own_conv_select", &own_conv_select, py::arg("x_shape"), py::arg("w_shape"), py::arg("pad"), py::arg("stride"),
        py::arg("residual"), py::arg("kernel") = "auto",
        "The name of the kernel own_conv_s8 would run for these NHWC / KRSC shapes (ValueError says why none can).");
  m.def("own_conv_device_mismatch", &own_conv_device_mismatch, py::arg("kernel"),
        "'' when the current GPU runs the kernel's code (sm_90a: compute capability 9.0), else why not.");
  m.def("own_conv_s8", &own_conv_s8, py::arg("x"), py::arg("w"), py::arg("out"), py::kw_only(), py::arg("alpha"),
        py::arg("bias"), py::arg("pad"), py::arg("stride"), py::arg("residual") = py::none(), py::arg("beta") = 0.0,
        py::arg("relu") = true, py::arg("kernel") = "auto", py::arg("stream") = 0,
        "out = sat(rne(clamp(alpha * conv(x, w) + bias [+ beta * residual], 0 if relu else -127, 127))): int8 NHWC "
        "x, residual and out, KRSC w, fp32 alpha and bias (K,); returns out (allocated when None).");
}

}  // namespace rn
