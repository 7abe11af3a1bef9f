// The plain key that identifies a convolution problem for algorithm search and caching (after PyTorch's
// ConvolutionParams): device, types, layout, every shape, pad/stride/dilation/groups, math and determinism
// settings, the workspace cap and which engine/fusion is asked for. Zero-initialised and compared bytewise,
// so it must stay a standard-layout struct of fixed-width fields.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include "../core/dtype.h"
#include "conv_names.h"

namespace rn {

// The dtypes a quantised convolution may write y in, and the code ConvParams::out_dtype holds for one (1 + DType:
// 0 means the storage dtype).
inline constexpr DType kQuantizedOutDtypes[] = {DType::I8, DType::FP8, DType::F16, DType::F32};
inline constexpr uint8_t out_dtype_code(DType t) {
  return static_cast<uint8_t>(static_cast<uint8_t>(t) + 1);
}

struct ConvParams {
  int32_t device;
  uint8_t direction;      // ConvDirection
  uint8_t precision;      // Precision (fixes storage dtype and math)
  uint8_t layout;         // Layout
  uint8_t engine;         // ConvEngineKind asked for ('auto' keys the winner of timing both, auto_engine.h)
  uint8_t epilogue;       // EpilogueFlags (Forward only)
  uint8_t deterministic;  // 1: only deterministic algorithms
  uint8_t algo_mode;      // AlgoMode asked for: find, heuristic and fixed choices are cached separately
  uint8_t out_dtype;      // 0: y in the storage dtype; else 1 + the DType of y (quantised forward: int8 / fp8 /
                          // fp16 / fp32). Also keeps the struct free of implicit padding bytes.
  int32_t x[4];           // logical N, C, H, W of the input
  int32_t w[4];           // K, C / groups, R, S
  int32_t y[4];           // logical N, K, P, Q of the output
  int32_t pad[2], stride[2], dilation[2];
  int32_t groups;
  int32_t fixed_algo;      // AlgoMode::Fixed: the algorithm asked for (legacy algo enum / graph engine id); else 0
  int32_t reserved1_;      // explicit padding (always 0)
  uint64_t workspace_cap;  // bytes; UINT64_MAX: no cap

  ConvParams() { std::memset(this, 0, sizeof(*this)); }
  bool operator==(const ConvParams& o) const { return std::memcmp(this, &o, sizeof(*this)) == 0; }
  bool operator!=(const ConvParams& o) const { return !(*this == o); }

  // The dtype of y (the storage dtype unless out_dtype says otherwise).
  DType y_dtype() const {
    return out_dtype == 0 ? storage_dtype(static_cast<Precision>(precision)) : static_cast<DType>(out_dtype - 1);
  }

  // One line, stable across runs: the key of the on-disk cache file, e.g.
  // "conv2d.v1 dir=fwd dev=0 prec=fp16 layout=NHWC engine=legacy epi=bias+relu det=0 mode=find fixed=0
  //  x=8,64,32,32 w=64,64,3,3 y=8,64,32,32 pad=1,1 stride=1,1 dil=1,1 groups=1 ws=none" (on one line), with
  //  " out=fp16" appended when y's dtype is not the storage dtype.
  std::string to_string() const;
  // Inverse of to_string(); throws rn::ValueError on malformed text.
  static ConvParams from_string(const std::string& text);
};

// Bytewise equality and hashing are only sound without padding bytes (whose values copies need not keep).
static_assert(std::has_unique_object_representations_v<ConvParams>, "ConvParams must have no padding bytes");

struct ConvParamsHash {
  size_t operator()(const ConvParams& p) const {
    // FNV-1a over the bytes (there are no padding bytes, see the static_assert above).
    const auto* bytes = reinterpret_cast<const unsigned char*>(&p);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(p); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// What algorithm search decided for one ConvParams. Everything needed to run again without re-timing:
// for the legacy engine the algo enum and math type; for the graph engine the engine id and knob choices
// ("knob=value;knob=value"), from which the execution plan is rebuilt after a cache-file load.
struct AlgoChoice {
  uint8_t engine = 0;      // ConvEngineKind::Legacy or Graph
  uint8_t mode = 0;        // AlgoMode that produced it
  int32_t algo = -1;       // legacy: cudnnConvolution*Algo_t; graph: engine global index
  int32_t math_type = 0;   // legacy: cudnnMathType_t as returned by Find
  std::string knobs;       // graph: knob choices
  uint64_t workspace = 0;  // bytes needed
  float time_ms = -1.0f;   // measured by Find; -1 when not timed
  float search_ms = 0.0f;  // host wall time spent choosing (the search, 'auto''s timing of both engines); 0 when
                           // loaded from a file
  std::string fused_path;  // which path ran for fused ops ("fused", "unfused: <why>")
};

}  // namespace rn

#include "../core/tensor.h"

namespace rn {

// The arrays of one convolution call, already validated by the bindings. Unused operands are undefined views.
//   Forward:        x, w -> y            (epilogue: + bias, + alpha2 * z, relu)
//   BackwardData:   dy (in `y`), w -> dx (in `x`)
//   BackwardFilter: x, dy (in `y`) -> dw (in `w`)
struct ConvOperands {
  TensorView x, w, y;
  TensorView z;         // residual input (Forward with kEpilogueResidual)
  TensorView bias;      // (K,) in the storage dtype, fp32 for int8 / fp8 (Forward with kEpilogueBias)
  TensorView scale;     // (K,) fp32 per-channel multiplier (Forward with kEpilogueScale: int8 / fp8)
  float alpha1 = 1.0f;  // scale of the convolution result
  float alpha2 = 1.0f;  // scale of z
  float beta = 0.0f;    // output accumulation: out = conv + beta * out (BackwardFilter gradient accumulation)
};

}  // namespace rn
