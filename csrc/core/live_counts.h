// Live-object accounting for everything created through cudnnCreate* / cudnnBackendCreateDescriptor.
// Counters live here, in C++, so Python sees the truth (resnet_native.live_descriptors()).
#pragma once

#include <cudnn.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace rn {

// Legacy kinds first; backend descriptor types follow at kBackendBase + cudnnBackendDescriptorType_t.
enum DescriptorKind : int {
  kHandle = 0,
  kTensor,
  kFilter,
  kConvolution,
  kActivation,
  kPooling,
  kBackendBase = 16,
  kNumKinds = kBackendBase + 64,
};

std::atomic<int64_t>& live_counter(int kind);
// Name of a kind ("tensor", "backend.OPERATIONGRAPH", ...).
const char* descriptor_kind_name(int kind);
// {name: live count} for every kind that has ever been created.
std::map<std::string, int64_t> live_descriptor_counts();

}  // namespace rn
