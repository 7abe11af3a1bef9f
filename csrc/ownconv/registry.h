// The compiled kernels of the layer. Each instantiation's translation unit registers its kernel while the
// extension loads (a Registration object), so adding a kernel is adding one such file (conv_sm90.cuh says how); a
// build without them has an empty registry and says why (build_status).
#pragma once

#include <string>
#include <vector>

#include "own_conv.h"

namespace rn::ownconv {

// Registers `kernel` (a static object that outlives every use) at static-initialisation time.
class Registration {
 public:
  explicit Registration(const ConvKernel* kernel);
};

// Defines the kernel object NAME of type __VA_ARGS__ (a ConvKernel constructed from its name) in the translation
// unit's anonymous namespace and registers it under NAME; each kernel family's macro (conv_sm90.cuh, ...) is this.
#define RN_OWNCONV_REGISTER(NAME, ...)                                   \
  namespace {                                                            \
  const __VA_ARGS__ kernel_##NAME(#NAME);                                \
  const ::rn::ownconv::Registration registration_##NAME(&kernel_##NAME); \
  }

// Every registered kernel, sorted by name.
const std::vector<const ConvKernel*>& kernels();
// The kernel of that name, or nullptr.
const ConvKernel* find_kernel(const std::string& name);

// Whether the build compiled the kernels, and if not why (resnet_native_build/build_ext.py decides and defines
// the macros build_status.cpp reads).
struct BuildStatus {
  bool built = false;
  std::string reason;           // "" when built, else e.g. "not built: the device compiler is clang"
  std::string cutlass_version;  // "4.2.0", or "" when no CUTLASS was used
};
BuildStatus build_status();

}  // namespace rn::ownconv
