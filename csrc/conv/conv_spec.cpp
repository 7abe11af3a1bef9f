#include "conv_spec.h"

#include <string>

#include "../core/error.h"

namespace rn {
namespace {

std::string pair_str(const std::array<int64_t, 2>& v) {
  return "(" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ")";
}

std::array<int32_t, 2> checked_pair(const std::array<int64_t, 2>& v, const char* name, int64_t minimum) {
  for (int64_t value : v) {
    if (value < minimum || value > INT32_MAX) {
      throw ValueError(std::string(name) + ": every value must be between " + std::to_string(minimum) + " and " +
                       std::to_string(INT32_MAX) + ", got " + pair_str(v));
    }
  }
  return {static_cast<int32_t>(v[0]), static_cast<int32_t>(v[1])};
}

}  // namespace

ConvSpec ConvSpec::make(const std::array<int64_t, 2>& stride, const std::array<int64_t, 2>& padding,
                        const std::array<int64_t, 2>& dilation, int64_t groups, Layout layout, Precision precision,
                        ConvEngineKind engine, AlgoMode algo_mode, int64_t fixed_algo, bool deterministic) {
  ConvSpec s;
  s.stride = checked_pair(stride, "stride", 1);
  s.padding = checked_pair(padding, "padding", 0);
  s.dilation = checked_pair(dilation, "dilation", 1);
  if (groups < 1 || groups > INT32_MAX) {
    throw ValueError("groups: must be between 1 and " + std::to_string(INT32_MAX) + ", got " + std::to_string(groups));
  }
  if (fixed_algo < 0 || fixed_algo > INT32_MAX) {
    throw ValueError("algo: a fixed algorithm's index must be between 0 and " + std::to_string(INT32_MAX) + ", got " +
                     std::to_string(fixed_algo));
  }
  s.groups = static_cast<int32_t>(groups);
  s.layout = layout;
  s.precision = precision;
  s.engine = engine;
  s.algo_mode = algo_mode;
  s.fixed_algo = algo_mode == AlgoMode::Fixed ? static_cast<int32_t>(fixed_algo) : 0;
  s.deterministic = deterministic;
  return s;
}

bool ConvSpec::operator==(const ConvSpec& o) const {
  return stride == o.stride && padding == o.padding && dilation == o.dilation && groups == o.groups &&
         layout == o.layout && precision == o.precision && engine == o.engine && algo_mode == o.algo_mode &&
         fixed_algo == o.fixed_algo && deterministic == o.deterministic;
}

}  // namespace rn
