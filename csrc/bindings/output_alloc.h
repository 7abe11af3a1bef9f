// How every op binding allocates an output it was not given: a cupy.empty array, made only after all the op's
// arguments have been validated and checked to be on the current device (see OpArgs::prepare_device), so a bad
// argument is reported as such and never as an allocation or CUDA error. The array is returned to the caller.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "../core/dtype.h"

namespace rn {

// A new, uninitialised cupy array of `shape` holding `dtype` on the current device (bf16: uint16 bits). cupy is
// imported on first use; an ImportError says how to get it (or to pass the output in).
pybind11::object new_device_array(const std::vector<int64_t>& shape, DType dtype, const char* name);

}  // namespace rn
