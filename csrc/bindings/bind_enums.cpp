// The native core's enums as typed Python enums (resnet_native._C.DType, Precision, Layout, ...): ops take them
// instead of strings, so nothing is parsed per call. Their member names are the package's names
// (resnet_native/names.py; tests/test_names_cpu.py checks that the two agree).
#include <pybind11/pybind11.h>

#include "../core/dtype.h"
#include "bindings.h"

namespace py = pybind11;

namespace rn {

void bind_enums(py::module_& m) {
  py::enum_<DType>(m, "DType", "Element type of an op's array arguments (bf16: uint16 arrays of bf16 bits).")
      .value("fp32", DType::F32)
      .value("fp16", DType::F16)
      .value("bf16", DType::BF16);
  py::enum_<Precision>(m, "Precision", "Storage dtype plus the math cuDNN may use (fp32 strict, tf32, fp16, bf16).")
      .value("fp32", Precision::FP32)
      .value("tf32", Precision::TF32)
      .value("fp16", Precision::FP16)
      .value("bf16", Precision::BF16);
  py::enum_<Layout>(m, "Layout", "Activation layout: NCHW (N, C, H, W) or NHWC (N, H, W, C).")
      .value("NCHW", Layout::NCHW)
      .value("NHWC", Layout::NHWC);
}

}  // namespace rn
