#include "own_conv.h"

namespace rn::ownconv {

std::string ConvProblem::describe() const {
  auto pair = [](int a, int b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; };
  return "x (" + std::to_string(n) + ", " + std::to_string(h) + ", " + std::to_string(w) + ", " + std::to_string(c) +
         "), w (" + std::to_string(k) + ", " + std::to_string(r) + ", " + std::to_string(s) + ", " + std::to_string(c) +
         "), pad " + pair(pad_h, pad_w) + ", stride " + pair(stride_h, stride_w);
}

const char* epilogue_name(Epilogue e) {
  return e == Epilogue::RequantizeResidual ? "requantize_residual" : "requantize";
}

bool has_residual(Epilogue e) {
  return e == Epilogue::RequantizeResidual;
}

}  // namespace rn::ownconv
