// resnet_native._C._testing: what only the tests and the measurement tools call (hooks into the core's pieces, a
// probe that allocates and synchronises). Kept out of the top-level module so the package's API there is only
// what the package itself uses.
#pragma once

#include <pybind11/pybind11.h>

namespace rn {

// Adds the _testing submodule to `m` and fills it.
void bind_testing(pybind11::module_& m);
// The hooks of the convolution key, the algorithm cache, legacy descriptor groups and the graph engine.
void bind_testing_conv(pybind11::module_& t);

}  // namespace rn
