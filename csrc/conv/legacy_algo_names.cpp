#include "legacy_algo_names.h"

#include <cudnn.h>

namespace rn::legacy {

const std::vector<std::string>& algo_names(ConvDirection direction) {
  static const std::vector<std::string> forward = {
      "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const std::vector<std::string> backward_data = {"ALGO_0",     "ALGO_1",   "FFT",
                                                         "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const std::vector<std::string> backward_filter = {
      "ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  static_assert(CUDNN_CONVOLUTION_FWD_ALGO_COUNT == 8 && CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT == 6 &&
                    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT == 7,
                "cuDNN's algorithm lists changed: update the name tables");
  switch (direction) {
    case ConvDirection::Forward:
      return forward;
    case ConvDirection::BackwardData:
      return backward_data;
    case ConvDirection::BackwardFilter:
      return backward_filter;
  }
  return forward;
}

std::string algo_name(ConvDirection direction, int algo) {
  const auto& names = algo_names(direction);
  return algo >= 0 && algo < static_cast<int>(names.size()) ? names[algo] : "algo" + std::to_string(algo);
}

bool algo_is_deterministic(ConvDirection direction, int algo) {
  switch (direction) {
    case ConvDirection::Forward:
      return true;
    case ConvDirection::BackwardData:
      return algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
    case ConvDirection::BackwardFilter:
      return algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 && algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
  }
  return false;
}

std::string math_type_name(int math_type) {
  switch (math_type) {
    case CUDNN_DEFAULT_MATH:
      return "DEFAULT_MATH";
    case CUDNN_TENSOR_OP_MATH:
      return "TENSOR_OP_MATH";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "TENSOR_OP_MATH_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH:
      return "FMA_MATH";
  }
  return "math" + std::to_string(math_type);
}

}  // namespace rn::legacy
