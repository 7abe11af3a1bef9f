// Which compiled kernel runs a problem: a named one, checked, or "auto". Host only (the CPU tests call it).
#pragma once

#include <string>

#include "own_conv.h"

namespace rn::ownconv {

// "" when `kernel` can run `problem` with inputs of `dtype` and epilogue `epilogue`, else why not.
std::string why_not(const ConvKernel& kernel, const ConvProblem& problem, DType dtype, Epilogue epilogue);

// The kernel named `name`, or for "auto" the preferred one of those that can run the problem: the largest tile
// whose output-channel and input-channel extents divide K and C (no partly empty tiles), else the smallest
// tile. A stand-in until per-layer timings choose (the inference engine's tuning). Throws ValueError naming
// `what` when no kernel (or not the named one) can run it, with each kernel's reason; std::runtime_error when
// the build has no kernels.
const ConvKernel& select_kernel(const ConvProblem& problem, DType dtype, Epilogue epilogue, const std::string& name,
                                const char* what = "kernel");

}  // namespace rn::ownconv
