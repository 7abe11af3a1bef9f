// The plain key that identifies a convolution problem for algorithm search and caching (after PyTorch's
// ConvolutionParams): device, types, layout, every shape, pad/stride/dilation/groups, math and determinism
// settings, the workspace cap and which engine/fusion is asked for. Zero-initialised and compared bytewise,
// so it must stay a standard-layout struct of fixed-width fields.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "../core/dtype.h"

namespace rn {

enum class ConvDirection : uint8_t { Forward = 0, BackwardData = 1, BackwardFilter = 2 };
enum class ConvEngineKind : uint8_t { Auto = 0, Legacy = 1, Graph = 2 };
enum class AlgoMode : uint8_t { Find = 0, Heuristic = 1, Fixed = 2 };

// Forward epilogue flags (ConvParams::epilogue): y = act(alpha1 * conv(x, w) + alpha2 * z + bias).
enum EpilogueFlags : uint8_t { kEpilogueNone = 0, kEpilogueBias = 1, kEpilogueResidual = 2, kEpilogueRelu = 4 };

struct ConvParams {
  int32_t device;
  uint8_t direction;      // ConvDirection
  uint8_t precision;      // Precision (fixes storage dtype and math)
  uint8_t layout;         // Layout
  uint8_t engine;         // ConvEngineKind actually keyed (Legacy or Graph; Auto resolves per engine)
  uint8_t epilogue;       // EpilogueFlags (Forward only)
  uint8_t deterministic;  // 1: only deterministic algorithms
  uint8_t padding_[2];
  int32_t x[4];  // logical N, C, H, W of the input
  int32_t w[4];  // K, C / groups, R, S
  int32_t y[4];  // logical N, K, P, Q of the output
  int32_t pad[2], stride[2], dilation[2];
  int32_t groups;
  uint64_t workspace_cap;  // bytes; UINT64_MAX: no cap

  ConvParams() { std::memset(this, 0, sizeof(*this)); }
  bool operator==(const ConvParams& o) const { return std::memcmp(this, &o, sizeof(*this)) == 0; }

  // One line, stable across runs: the key of the on-disk cache file.
  std::string to_string() const;
  // Inverse of to_string(); throws rn::ValueError on malformed text.
  static ConvParams from_string(const std::string& text);
};

struct ConvParamsHash {
  size_t operator()(const ConvParams& p) const {
    // FNV-1a over the bytes: the struct is zero-filled, so padding never holds garbage.
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
  uint8_t engine = 0;       // ConvEngineKind::Legacy or Graph
  uint8_t mode = 0;         // AlgoMode that produced it
  int32_t algo = -1;        // legacy: cudnnConvolution*Algo_t; graph: engine global index
  int32_t math_type = 0;    // legacy: cudnnMathType_t as returned by Find
  std::string knobs;        // graph: knob choices
  uint64_t workspace = 0;   // bytes needed
  float time_ms = -1.0f;    // measured by Find; -1 when not timed
  std::string fused_path;   // which path ran for fused ops ("fused", "unfused: <why>")
};

}  // namespace rn
