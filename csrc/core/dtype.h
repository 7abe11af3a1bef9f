// Element types, precision modes and layouts, with their names and the one parser of each name. A precision
// mode fixes the storage type of activations and weights, the accumulation type, and which math cuDNN may use
// (strict FMA, TF32 tensor cores, fp16/bf16 tensor cores). The names are the package's (resnet_native/_core/names.py).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <string>

namespace rn {

// F32, F16 and BF16 are the storage dtypes of activations, weights and gradients (bf16 arrays are often uint16
// arrays holding bf16 bits: cupy has no bfloat16). I32 is for flags such as the loss scaler's found_inf and U8 for
// images (the inference engine's input stage), F64 for the loss's running sums; they are never storage dtypes and
// have no Python name
// (resnet_native._C.DType lists the storage dtypes only). I8 and FP8 are the storage of the quantised forward
// convolutions (precisions INT8 and FP8): int8 arrays, and FP8 E4M3 codes held in uint8 arrays (cupy has no fp8).
enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, I32 = 3, U8 = 4, I8 = 5, FP8 = 6, F64 = 7 };

enum class Precision : uint8_t {
  FP32 = 0,  // fp32 storage, FMA math only (no tensor cores, no TF32)
  TF32 = 1,  // fp32 storage, TF32 tensor-core math allowed
  FP16 = 2,  // fp16 storage, fp32 accumulation, tensor cores
  BF16 = 3,  // bf16 storage, fp32 accumulation, tensor cores
  // Quantised inference (forward convolutions on the graph engine only): x, w and z in the 8-bit type, a
  // per-channel fp32 scale and an fp32 bias in the epilogue, y in the 8-bit type or in fp16 / fp32.
  INT8 = 4,  // int8 storage, exact int32 accumulation
  FP8 = 5,   // FP8 E4M3 storage, fp32 accumulation
};

inline bool is_quantized(Precision p) {
  return p == Precision::INT8 || p == Precision::FP8;
}

enum class Layout : uint8_t { NCHW = 0, NHWC = 1 };

inline int dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::U8:
    case DType::I8:
    case DType::FP8:
      return 1;
    case DType::F64:
      return 8;
    default:
      return 2;
  }
}

// The element type's NumPy-style name, as error messages show it: "float32", "float16", "bfloat16", "int32",
// "uint8", "int8", "float8_e4m3 (uint8 codes)".
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::F16:
      return "float16";
    case DType::BF16:
      return "bfloat16";
    case DType::I32:
      return "int32";
    case DType::U8:
      return "uint8";
    case DType::I8:
      return "int8";
    case DType::FP8:
      return "float8_e4m3 (uint8 codes)";
    case DType::F64:
      return "float64";
  }
  return "?";
}

// The package's name of a storage dtype ("fp32", "fp16", "bf16", "int8", "fp8"; "int32" for I32, "uint8" for U8).
inline const char* dtype_short_name(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::F16:
      return "fp16";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "int32";
    case DType::U8:
      return "uint8";
    case DType::I8:
      return "int8";
    case DType::FP8:
      return "fp8";
    case DType::F64:
      return "float64";
  }
  return "?";
}

inline cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return CUDNN_DATA_FLOAT;
    case DType::F16:
      return CUDNN_DATA_HALF;
    case DType::BF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::I32:
      return CUDNN_DATA_INT32;
    case DType::U8:
      return CUDNN_DATA_UINT8;
    case DType::I8:
      return CUDNN_DATA_INT8;
    case DType::FP8:
      return CUDNN_DATA_FP8_E4M3;
    case DType::F64:
      return CUDNN_DATA_DOUBLE;
  }
  return CUDNN_DATA_FLOAT;
}

inline DType storage_dtype(Precision p) {
  switch (p) {
    case Precision::FP32:
    case Precision::TF32:
      return DType::F32;
    case Precision::FP16:
      return DType::F16;
    case Precision::BF16:
      return DType::BF16;
    case Precision::INT8:
      return DType::I8;
    case Precision::FP8:
      return DType::FP8;
  }
  return DType::F32;
}

// Legacy API math type for a precision mode.
inline cudnnMathType_t cudnn_math_type(Precision p) {
  return p == Precision::FP32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::TF32:
      return "tf32";
    case Precision::FP16:
      return "fp16";
    case Precision::BF16:
      return "bf16";
    case Precision::INT8:
      return "int8";
    case Precision::FP8:
      return "fp8";
  }
  return "?";
}

inline const char* layout_name(Layout l) {
  return l == Layout::NCHW ? "NCHW" : "NHWC";
}

// The parsers of the names above; each raises ValueError ("dtype: expected one of ...") for anything else.
// A storage dtype by any accepted spelling: "fp32"/"float32"/"tf32" (tf32 data is fp32 data), "fp16"/"float16",
// "bf16"/"bfloat16".
DType parse_dtype(const std::string& name);
Precision parse_precision(const std::string& name);  // "fp32" | "tf32" | "fp16" | "bf16" | "int8" | "fp8"
Layout parse_layout(const std::string& name);        // "NCHW" | "NHWC"

}  // namespace rn
