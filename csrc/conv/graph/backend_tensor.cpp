#include "backend_tensor.h"

#include <vector>

#include "backend_attr.h"

namespace rn::graph {

std::array<int64_t, 4> layout_strides(const std::array<int64_t, 4>& dims, Layout layout) {
  const int64_t c = dims[1], h = dims[2], w = dims[3];
  if (layout == Layout::NCHW) return {c * h * w, h * w, w, 1};
  // NHWC memory order is N, H, W, C; the strides are still listed in logical N, C, H, W order.
  return {h * w * c, 1, w * c, c};
}

int64_t pointer_alignment(const void* address) {
  const auto bits = reinterpret_cast<uintptr_t>(address);
  int64_t alignment = 1;
  while (alignment < 16 && bits % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

BackendDescriptor make_tensor(const TensorSpec& spec) {
  BackendDescriptor t = make_backend(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  set_data_type(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, spec.dtype);
  set_int64s(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, std::vector<int64_t>(spec.dims.begin(), spec.dims.end()));
  set_int64s(t.get(), CUDNN_ATTR_TENSOR_STRIDES, std::vector<int64_t>(spec.strides.begin(), spec.strides.end()));
  set_int64(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, spec.uid);
  set_int64(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, spec.alignment);
  set_bool(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, spec.is_virtual);
  finalize(t.get());
  return t;
}

}  // namespace rn::graph
