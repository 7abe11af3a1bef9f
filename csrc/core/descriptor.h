// One move-only RAII template for every cuDNN object: legacy descriptors, the handle and backend descriptors.
// A descriptor is counted live only after its create call succeeded, and uncounted in the destructor, so an
// exception thrown half-way through building a group of descriptors leaks nothing.
#pragma once

#include <cudnn.h>

#include <utility>

#include "error.h"
#include "live_counts.h"

namespace rn {

template <class Traits>
class Descriptor {
 public:
  using Raw = typename Traits::Raw;

  template <class... Args>
  explicit Descriptor(Args... args) : kind_(Traits::kind(args...)) {
    Raw raw{};
    RN_CUDNN_CHECK(Traits::create(&raw, args...));
    raw_ = raw;
    live_counter(kind_).fetch_add(1, std::memory_order_relaxed);
  }
  ~Descriptor() { reset(); }

  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& other) noexcept : raw_(std::exchange(other.raw_, Raw{})), kind_(other.kind_) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    if (this != &other) {
      reset();
      raw_ = std::exchange(other.raw_, Raw{});
      kind_ = other.kind_;
    }
    return *this;
  }

  Raw get() const { return raw_; }
  explicit operator bool() const { return raw_ != Raw{}; }

  void reset() noexcept {
    if (raw_ != Raw{}) {
      Traits::destroy(raw_);  // A destroy status cannot be acted on in a destructor; it is dropped.
      live_counter(kind_).fetch_sub(1, std::memory_order_relaxed);
      raw_ = Raw{};
    }
  }

 private:
  Raw raw_{};
  int kind_;
};

#define RN_LEGACY_DESCRIPTOR_TRAITS(Name, RawType, Kind, CreateFn, DestroyFn) \
  struct Name {                                                               \
    using Raw = RawType;                                                      \
    static int kind() { return Kind; }                                        \
    static cudnnStatus_t create(Raw* raw) { return CreateFn(raw); }           \
    static void destroy(Raw raw) { DestroyFn(raw); }                          \
  }

RN_LEGACY_DESCRIPTOR_TRAITS(HandleTraits, cudnnHandle_t, kHandle, cudnnCreate, cudnnDestroy);
RN_LEGACY_DESCRIPTOR_TRAITS(TensorTraits, cudnnTensorDescriptor_t, kTensor, cudnnCreateTensorDescriptor,
                            cudnnDestroyTensorDescriptor);
RN_LEGACY_DESCRIPTOR_TRAITS(FilterTraits, cudnnFilterDescriptor_t, kFilter, cudnnCreateFilterDescriptor,
                            cudnnDestroyFilterDescriptor);
RN_LEGACY_DESCRIPTOR_TRAITS(ConvolutionTraits, cudnnConvolutionDescriptor_t, kConvolution,
                            cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor);
RN_LEGACY_DESCRIPTOR_TRAITS(ActivationTraits, cudnnActivationDescriptor_t, kActivation, cudnnCreateActivationDescriptor,
                            cudnnDestroyActivationDescriptor);
RN_LEGACY_DESCRIPTOR_TRAITS(PoolingTraits, cudnnPoolingDescriptor_t, kPooling, cudnnCreatePoolingDescriptor,
                            cudnnDestroyPoolingDescriptor);
#undef RN_LEGACY_DESCRIPTOR_TRAITS

struct BackendTraits {
  using Raw = cudnnBackendDescriptor_t;
  static int kind(cudnnBackendDescriptorType_t type) {
    const int index = static_cast<int>(type);
    return kBackendBase + (index >= 0 && index < kNumKinds - kBackendBase ? index : kNumKinds - kBackendBase - 1);
  }
  static cudnnStatus_t create(Raw* raw, cudnnBackendDescriptorType_t type) {
    return cudnnBackendCreateDescriptor(type, raw);
  }
  static void destroy(Raw raw) { cudnnBackendDestroyDescriptor(raw); }
};

using Handle = Descriptor<HandleTraits>;
using TensorDescriptor = Descriptor<TensorTraits>;
using FilterDescriptor = Descriptor<FilterTraits>;
using ConvolutionDescriptor = Descriptor<ConvolutionTraits>;
using ActivationDescriptor = Descriptor<ActivationTraits>;
using PoolingDescriptor = Descriptor<PoolingTraits>;
using BackendDescriptor = Descriptor<BackendTraits>;

}  // namespace rn
