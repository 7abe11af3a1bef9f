// What the build decided about the kernels (resnet_native_build/build_ext.py defines these macros for this file
// only; the kernels' own translation units are compiled only when built).
#include "registry.h"

#ifndef RN_BUILD_OWN_CONV_BUILT
#define RN_BUILD_OWN_CONV_BUILT 0
#endif
#ifndef RN_BUILD_OWN_CONV_REASON
#define RN_BUILD_OWN_CONV_REASON "not built: a build by other means than resnet_native_build"
#endif
#ifndef RN_BUILD_OWN_CONV_CUTLASS
#define RN_BUILD_OWN_CONV_CUTLASS ""
#endif

namespace rn::ownconv {

BuildStatus build_status() {
  return {RN_BUILD_OWN_CONV_BUILT != 0, RN_BUILD_OWN_CONV_REASON, RN_BUILD_OWN_CONV_CUTLASS};
}

}  // namespace rn::ownconv
