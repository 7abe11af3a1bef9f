// The convolution's own enums and their one table of names: directions, engines, algorithm modes and the forward
// epilogue's parts. Cache keys, error messages, the typed Python enums (bindings/bind_enums.cpp) and the parsers
// all read these tables; the Python side's names (resnet_native/_core/names.py) are the same strings.
#pragma once

#include <cstdint>
#include <string>

namespace rn {

enum class ConvDirection : uint8_t { Forward = 0, BackwardData = 1, BackwardFilter = 2 };
enum class ConvEngineKind : uint8_t { Auto = 0, Legacy = 1, Graph = 2 };
enum class AlgoMode : uint8_t { Find = 0, Heuristic = 1, Fixed = 2 };

// Forward epilogue flags (ConvParams::epilogue): y = act(alpha1 * conv(x, w) + alpha2 * z + bias).
// kEpilogueScale: a per-output-channel fp32 multiplier of the convolution result (the quantised forward's
// dequantise-requantise factor s_x * s_w[k] / s_y), applied first.
enum EpilogueFlags : uint8_t {
  kEpilogueNone = 0,
  kEpilogueBias = 1,
  kEpilogueResidual = 2,
  kEpilogueRelu = 4,
  kEpilogueScale = 8
};
constexpr uint8_t kEpilogueAll = kEpilogueBias | kEpilogueResidual | kEpilogueRelu | kEpilogueScale;

// A direction has three spellings: its name (Python, function arguments), the short key name of cache keys and
// the per-direction algorithm syntax, and the label of problem descriptions in errors.
struct DirectionNames {
  ConvDirection value;
  const char* name;
  const char* key;
  const char* label;
};
inline constexpr DirectionNames kDirectionNames[] = {
    {ConvDirection::Forward, "forward", "fwd", "forward"},
    {ConvDirection::BackwardData, "backward_data", "bwd_data", "backward-data"},
    {ConvDirection::BackwardFilter, "backward_filter", "bwd_filter", "backward-filter"},
};

template <class Enum>
struct EnumName {
  Enum value;
  const char* name;
};
inline constexpr EnumName<ConvEngineKind> kEngineNames[] = {
    {ConvEngineKind::Auto, "auto"}, {ConvEngineKind::Legacy, "legacy"}, {ConvEngineKind::Graph, "graph"}};
inline constexpr EnumName<AlgoMode> kAlgoModeNames[] = {
    {AlgoMode::Find, "find"}, {AlgoMode::Heuristic, "heuristic"}, {AlgoMode::Fixed, "fixed"}};
// In the order an epilogue's name lists them ("bias+residual+relu").
inline constexpr EnumName<EpilogueFlags> kEpiloguePartNames[] = {
    {kEpilogueScale, "scale"}, {kEpilogueBias, "bias"}, {kEpilogueResidual, "residual"}, {kEpilogueRelu, "relu"}};

// "fwd", "bwd_data", "bwd_filter": cache keys ("invalid" for a value outside the enum).
const char* direction_key(ConvDirection d);
// "forward", "backward-data", "backward-filter": problem descriptions.
const char* direction_label(ConvDirection d);
const char* engine_name(ConvEngineKind e);
const char* algo_mode_name(AlgoMode m);
// "none" or the "+"-joined parts; "+invalid" is appended for bits outside kEpilogueAll.
std::string epilogue_name(uint8_t flags);

// The parsers throw rn::ValueError naming what was expected. A direction is accepted by its name or its key name;
// an epilogue is "none", "" or a "+"-joined set of distinct parts.
ConvDirection parse_direction(const std::string& name);
ConvEngineKind parse_engine(const std::string& name);
AlgoMode parse_algo_mode(const std::string& name);
uint8_t parse_epilogue(const std::string& name);

}  // namespace rn
