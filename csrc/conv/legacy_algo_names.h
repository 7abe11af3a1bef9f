// The legacy API's algorithm and math-type enums by name: how algo strings name a fixed algorithm
// (resnet_native.conv.ConvSpec.algo), how choices are reported, and which algorithms are deterministic.
#pragma once

#include <string>
#include <vector>

#include "conv_names.h"

namespace rn::legacy {

// cuDNN's algorithm names of a direction without their prefix, indexed by enum value: forward
// "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", ...; backward-data "ALGO_0", "ALGO_1", "FFT", ...
const std::vector<std::string>& algo_names(ConvDirection direction);
// The name of one algorithm ("algo<N>" when out of range).
std::string algo_name(ConvDirection direction, int algo);
// False for the algorithms cuDNN documents as non-deterministic (atomic accumulation).
bool algo_is_deterministic(ConvDirection direction, int algo);
// "DEFAULT_MATH", "TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION", "FMA_MATH".
std::string math_type_name(int math_type);

}  // namespace rn::legacy
