// Test hooks of the core and of argument parsing, and the legacy INT8x32 probe (tools/probe_quantized.py).
#include "bind_testing.h"

#include <pybind11/stl.h>

#include <cudnn.h>

#include <string>
#include <utility>
#include <vector>

#include "../bindings/op_args.h"
#include "../bindings/tensor_arg.h"
#include "../core/descriptor.h"
#include "../core/device.h"
#include "../core/error.h"
#include "../core/workspace.h"
#include "legacy_int8_probe.h"

namespace py = pybind11;

namespace rn {
namespace {

// Creates and destroys `count` descriptors of one kind: the leak tests' workload, looped in C++ so that 10k
// iterations take milliseconds.
void create_destroy(const std::string& kind, int count) {
  static const std::pair<const char*, cudnnBackendDescriptorType_t> kBackendKinds[] = {
      {"backend.TENSOR", CUDNN_BACKEND_TENSOR_DESCRIPTOR},
      {"backend.CONVOLUTION", CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR},
      {"backend.POINTWISE", CUDNN_BACKEND_POINTWISE_DESCRIPTOR},
      {"backend.OPERATION_CONVOLUTION_FORWARD", CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR},
      {"backend.OPERATION_CONVOLUTION_BACKWARD_DATA", CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR},
      {"backend.OPERATION_CONVOLUTION_BACKWARD_FILTER", CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR},
      {"backend.OPERATION_POINTWISE", CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR},
      {"backend.OPERATIONGRAPH", CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR},
      {"backend.ENGINEHEUR", CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR},
      {"backend.ENGINE", CUDNN_BACKEND_ENGINE_DESCRIPTOR},
      {"backend.ENGINECFG", CUDNN_BACKEND_ENGINECFG_DESCRIPTOR},
      {"backend.KNOB_CHOICE", CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR},
      {"backend.EXECUTION_PLAN", CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR},
      {"backend.VARIANT_PACK", CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR},
  };
  for (int i = 0; i < count; ++i) {
    if (kind == "tensor") {
      TensorDescriptor d;
    } else if (kind == "filter") {
      FilterDescriptor d;
    } else if (kind == "convolution") {
      ConvolutionDescriptor d;
    } else if (kind == "activation") {
      ActivationDescriptor d;
    } else if (kind == "pooling") {
      PoolingDescriptor d;
    } else if (kind == "handle") {
      Handle d;
    } else {
      bool found = false;
      for (const auto& [name, type] : kBackendKinds) {
        if (kind == name) {
          BackendDescriptor d(type);
          found = true;
          break;
        }
      }
      if (!found) throw ValueError("kind: unknown descriptor kind '" + kind + "'");
    }
  }
}

std::vector<std::string> descriptor_kinds() {
  return {"tensor",
          "filter",
          "convolution",
          "activation",
          "pooling",
          "backend.TENSOR",
          "backend.CONVOLUTION",
          "backend.POINTWISE",
          "backend.OPERATION_CONVOLUTION_FORWARD",
          "backend.OPERATION_CONVOLUTION_BACKWARD_DATA",
          "backend.OPERATION_CONVOLUTION_BACKWARD_FILTER",
          "backend.OPERATION_POINTWISE",
          "backend.OPERATIONGRAPH",
          "backend.ENGINEHEUR",
          "backend.ENGINE",
          "backend.ENGINECFG",
          "backend.KNOB_CHOICE",
          "backend.EXECUTION_PLAN",
          "backend.VARIANT_PACK"};
}

// Builds a group of descriptors and fails while setting the last one: proves RAII cleans up a half-built
// group.
void failing_construction() {
  TensorDescriptor x;
  FilterDescriptor w;
  RN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 3, 8, 8));
  BackendDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  RN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, -1, 3, 3, 3));
}

py::tuple parse_tensor(py::handle obj, const std::string& name, const std::string& dtype, int ndim, bool check_device,
                       bool writable) {
  // int32: found_inf and the other flags the cupy kernels of resnet_native.multi_tensor read
  const DType want = dtype == "int32" ? DType::I32 : parse_dtype(dtype);
  TensorArgOptions options;
  options.ndim = ndim;
  options.check_device = check_device;
  options.writable = writable;
  TensorView v = tensor_arg(obj, name.c_str(), want, options);
  py::tuple shape(v.ndim);
  for (int i = 0; i < v.ndim; ++i) shape[i] = v.shape[i];
  return py::make_tuple(reinterpret_cast<uintptr_t>(v.data), dtype_name(v.dtype), shape);
}

py::object parse_scalar(py::handle obj, const std::string& name) {
  OpArgs args("parse_scalar");
  const kernels::ScalarArg s = scalar_arg(args, obj, name.c_str());
  if (s.ptr) return py::int_(reinterpret_cast<uintptr_t>(s.ptr));
  return py::float_(s.value);
}

uintptr_t handle_stream(uintptr_t stream) {
  cudnnHandle_t handle = cudnn_handle(stream_arg(stream));
  cudaStream_t bound = nullptr;
  RN_CUDNN_CHECK(cudnnGetStream(handle, &bound));
  return reinterpret_cast<uintptr_t>(bound);
}

uintptr_t workspace_get(size_t bytes, uintptr_t stream, bool search) {
  WorkspacePool& pool = WorkspacePool::current();
  return reinterpret_cast<uintptr_t>(search ? pool.try_get_for_search(bytes, stream_arg(stream))
                                            : pool.get(bytes, stream_arg(stream)));
}

py::dict probe_legacy_int8x32(int n, int c, int h, int w, int k, int r, int stride, int pad, bool int8_out, int runs) {
  if (n < 1 || c < 32 || c % 32 || k < 32 || k % 32 || h < 1 || w < 1 || r < 1 || stride < 1 || pad < 0 || runs < 1) {
    throw ValueError("probe_legacy_int8x32: expected positive sizes with c and k multiples of 32");
  }
  const Int8x32Probe p = probe_int8x32(n, c, h, w, k, r, stride, pad, int8_out, runs);
  py::dict d;
  d["supported"] = p.supported;
  d["error"] = p.error;
  d["ms"] = p.ms;
  d["workspace"] = p.workspace;
  return d;
}

}  // namespace

void bind_testing(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", "Hooks for the tests and the measurement tools; not the package's API.");
  t.def("descriptor_kinds", &descriptor_kinds, "Kinds accepted by create_destroy.");
  t.def("create_destroy", &create_destroy, py::arg("kind"), py::arg("count"));
  t.def("failing_construction", &failing_construction,
        "Builds descriptors and fails half-way (a cuDNN error): what RAII must clean up.");
  t.def("handle_stream", &handle_stream, py::arg("stream"),
        "Bind the current device's handle to `stream`; returns the stream cuDNN reports.");
  t.def("workspace_get", &workspace_get, py::arg("bytes"), py::arg("stream") = 0, py::arg("search") = false,
        "A pointer to the current device's workspace of at least `bytes`, as an op (or with search, a search's "
        "candidate) asks for it.");
  t.def("parse_tensor", &parse_tensor, py::arg("obj"), py::arg("name"), py::arg("dtype"), py::arg("ndim") = -1,
        py::arg("check_device") = true, py::arg("writable") = false,
        "Validate an array argument exactly as ops do (writable: as an output); returns (pointer, dtype, shape).");
  t.def("parse_scalar", &parse_scalar, py::arg("obj"), py::arg("name"),
        "How the optimizer ops read a scalar argument: its float value, or a device array's pointer.");
  t.def("probe_legacy_int8x32", &probe_legacy_int8x32, py::arg("n"), py::arg("c"), py::arg("h"), py::arg("w"),
        py::arg("k"), py::arg("r"), py::arg("stride"), py::arg("pad"), py::arg("int8_out"), py::arg("runs"),
        "A measurement (tools/probe_quantized.py): the legacy INT8x32 conv + bias + ReLU on zeros, {supported, "
        "error, ms, workspace}. Allocates and synchronises.");
  bind_testing_conv(t);
}

}  // namespace rn
