// The native core's enums as typed Python enums (resnet_native._C.DType, Precision, Layout, Direction, Engine,
// AlgoMode): ops take them instead of strings, so nothing is parsed per call. Their member names are the
// package's names (resnet_native/_core/names.py; tests check that the two agree); the convolution's come from its one
// name table (conv/conv_names.h).
#include <pybind11/pybind11.h>

#include "../conv/conv_names.h"
#include "../core/dtype.h"
#include "bindings.h"

namespace py = pybind11;

namespace rn {

void bind_enums(py::module_& m) {
  py::enum_<DType>(m, "DType", "Element type of an op's array arguments (bf16: uint16 arrays of bf16 bits).")
      .value("fp32", DType::F32)
      .value("fp16", DType::F16)
      .value("bf16", DType::BF16);
  py::enum_<Precision>(m, "Precision",
                       "Storage dtype plus the math cuDNN may use (fp32 strict, tf32, fp16, bf16; int8 and fp8: "
                       "quantised forward convolutions only).")
      .value("fp32", Precision::FP32)
      .value("tf32", Precision::TF32)
      .value("fp16", Precision::FP16)
      .value("bf16", Precision::BF16)
      .value("int8", Precision::INT8)
      .value("fp8", Precision::FP8);
  py::enum_<Layout>(m, "Layout", "Activation layout: NCHW (N, C, H, W) or NHWC (N, H, W, C).")
      .value("NCHW", Layout::NCHW)
      .value("NHWC", Layout::NHWC);

  py::enum_<ConvDirection> direction(m, "Direction",
                                     "A convolution's direction: forward, backward_data, backward_filter.");
  for (const DirectionNames& d : kDirectionNames) direction.value(d.name, d.value);
  py::enum_<ConvEngineKind> engine(m, "Engine", "Convolution engine: auto (the faster per problem), legacy, graph.");
  for (const auto& e : kEngineNames) engine.value(e.name, e.value);
  py::enum_<AlgoMode> algo_mode(m, "AlgoMode", "How a convolution algorithm is chosen: find, heuristic, fixed.");
  for (const auto& a : kAlgoModeNames) algo_mode.value(a.name, a.value);
}

}  // namespace rn
