// How to convolve, as the ops take it: geometry, layout, precision, engine and algorithm choice of one direction.
// resnet_native.conv.ConvSpec builds one per direction (its `algo` string resolved) once, and every call passes it
// as a typed object (resnet_native._C.ConvSpec), so no call parses strings or re-checks ranges.
#pragma once

#include <array>
#include <cstdint>

#include "../core/dtype.h"
#include "conv_names.h"

namespace rn {

struct ConvSpec {
  std::array<int32_t, 2> stride{1, 1};
  std::array<int32_t, 2> padding{0, 0};
  std::array<int32_t, 2> dilation{1, 1};
  int32_t groups = 1;
  Layout layout = Layout::NCHW;
  Precision precision = Precision::FP32;
  ConvEngineKind engine = ConvEngineKind::Auto;
  AlgoMode algo_mode = AlgoMode::Find;
  int32_t fixed_algo = 0;  // AlgoMode::Fixed: legacy algorithm enum value or graph engine id; else 0
  bool deterministic = false;

  // A spec from caller values, validated: stride and dilation >= 1, padding >= 0, groups >= 1, each at most
  // INT32_MAX (the cache key's width); fixed_algo between 0 and INT32_MAX, kept only for AlgoMode::Fixed.
  // Throws rn::ValueError naming the argument.
  static ConvSpec make(const std::array<int64_t, 2>& stride, const std::array<int64_t, 2>& padding,
                       const std::array<int64_t, 2>& dilation, int64_t groups, Layout layout, Precision precision,
                       ConvEngineKind engine, AlgoMode algo_mode, int64_t fixed_algo, bool deterministic);

  bool operator==(const ConvSpec& o) const;
  bool operator!=(const ConvSpec& o) const { return !(*this == o); }
};

}  // namespace rn
