// Typed wrappers around cudnnBackendSetAttribute / GetAttribute / Finalize. The raw calls take a type tag, an
// element count and a void pointer; a mismatch between the three is silently wrong or a BAD_PARAM far from its
// cause. These helpers derive tag and count from the C++ type, and every status goes through RN_CUDNN_CHECK so
// a failure names the attribute call and the op in flight (OpContext).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <vector>

#include "../../core/descriptor.h"
#include "../../core/error.h"

namespace rn::graph {

using BackendRaw = cudnnBackendDescriptor_t;

inline void set_int64(BackendRaw d, cudnnBackendAttributeName_t name, int64_t value) {
  RN_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_INT64, 1, &value));
}

inline void set_int64s(BackendRaw d, cudnnBackendAttributeName_t name, const std::vector<int64_t>& values) {
  RN_CUDNN_CHECK(
      cudnnBackendSetAttribute(d, name, CUDNN_TYPE_INT64, static_cast<int64_t>(values.size()), values.data()));
}

inline void set_bool(BackendRaw d, cudnnBackendAttributeName_t name, bool value) {
  // CUDNN_TYPE_BOOLEAN is a C `bool`.
  RN_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_BOOLEAN, 1, &value));
}

inline void set_float(BackendRaw d, cudnnBackendAttributeName_t name, float value) {
  RN_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_FLOAT, 1, &value));
}

inline void set_data_type(BackendRaw d, cudnnBackendAttributeName_t name, cudnnDataType_t value) {
  RN_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_DATA_TYPE, 1, &value));
}

inline void set_descriptor(BackendRaw d, cudnnBackendAttributeName_t name, BackendRaw value) {
  RN_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value));
}

inline void set_descriptors(BackendRaw d, cudnnBackendAttributeName_t name, const std::vector<BackendRaw>& values) {
  RN_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(values.size()),
                                          values.data()));
}

inline void set_handle(BackendRaw d, cudnnBackendAttributeName_t name, cudnnHandle_t handle) {
  RN_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_HANDLE, 1, &handle));
}

inline void set_pointers(BackendRaw d, cudnnBackendAttributeName_t name, const std::vector<void*>& values) {
  RN_CUDNN_CHECK(
      cudnnBackendSetAttribute(d, name, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(values.size()), values.data()));
}

inline void set_pointer(BackendRaw d, cudnnBackendAttributeName_t name, void* value) {
  RN_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_VOID_PTR, 1, &value));
}

// Any enum-valued attribute (convolution mode, pointwise mode, heuristic mode, knob type): the tag says which.
template <class Enum>
void set_enum(BackendRaw d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, Enum value) {
  RN_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, type, 1, &value));
}

inline void finalize(BackendRaw d) {
  RN_CUDNN_CHECK(cudnnBackendFinalize(d));
}

inline int64_t get_int64(BackendRaw d, cudnnBackendAttributeName_t name) {
  int64_t value = 0;
  int64_t count = 0;
  RN_CUDNN_CHECK(cudnnBackendGetAttribute(d, name, CUDNN_TYPE_INT64, 1, &count, &value));
  return value;
}

// A new backend descriptor of `type`, counted live (see core/descriptor.h).
inline BackendDescriptor make_backend(cudnnBackendDescriptorType_t type) {
  return BackendDescriptor(type);
}

}  // namespace rn::graph
