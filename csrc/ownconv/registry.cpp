#include "registry.h"

#include <algorithm>

namespace rn::ownconv {
namespace {

// Function-local: filled by Registration objects of other translation units, whose static initialisation may
// run before this file's.
std::vector<const ConvKernel*>& mutable_kernels() {
  static std::vector<const ConvKernel*> list;
  return list;
}

}  // namespace

Registration::Registration(const ConvKernel* kernel) {
  auto& list = mutable_kernels();
  const auto at = std::lower_bound(list.begin(), list.end(), kernel, [](const ConvKernel* a, const ConvKernel* b) {
    return a->info().name < b->info().name;
  });
  list.insert(at, kernel);
}

const std::vector<const ConvKernel*>& kernels() {
  return mutable_kernels();
}

const ConvKernel* find_kernel(const std::string& name) {
  for (const ConvKernel* kernel : kernels()) {
    if (kernel->info().name == name) return kernel;
  }
  return nullptr;
}

}  // namespace rn::ownconv
