#include "dtype.h"

#include "error.h"

namespace rn {

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32" || name == "tf32") return DType::F32;
  if (name == "fp16" || name == "float16") return DType::F16;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  throw ValueError("dtype: expected one of 'fp32', 'fp16', 'bf16', got '" + name + "'");
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "tf32") return Precision::TF32;
  if (name == "fp16") return Precision::FP16;
  if (name == "bf16") return Precision::BF16;
  if (name == "int8") return Precision::INT8;
  if (name == "fp8") return Precision::FP8;
  throw ValueError("precision: expected one of 'fp32', 'tf32', 'fp16', 'bf16', 'int8', 'fp8', got '" + name + "'");
}

Layout parse_layout(const std::string& name) {
  if (name == "NCHW") return Layout::NCHW;
  if (name == "NHWC") return Layout::NHWC;
  throw ValueError("layout: expected 'NCHW' or 'NHWC', got '" + name + "'");
}

}  // namespace rn
