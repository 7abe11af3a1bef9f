// Each part of the extension registers its Python functions in its own bind_*.cpp; module.cpp calls them all.
#pragma once

#include <pybind11/pybind11.h>

namespace rn {

void bind_core(pybind11::module_& m);  // errors, version, devices, handles, descriptors, workspace

}  // namespace rn
