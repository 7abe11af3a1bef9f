#include "max_pool.h"

#include "../core/descriptor.h"
#include "../core/device.h"
#include "../core/error.h"
#include "../core/cudnn_tensor_4d.h"

namespace rn {
namespace {

PoolingDescriptor make_pooling(const PoolWindow& w) {
  PoolingDescriptor desc;
  RN_CUDNN_CHECK(cudnnSetPooling2dDescriptor(desc.get(), CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_PROPAGATE_NAN,
                                             w.kernel[0], w.kernel[1], w.padding[0], w.padding[1], w.stride[0],
                                             w.stride[1]));
  return desc;
}

}  // namespace

std::array<int, 4> max_pool2d_output_dims(const std::array<int, 4>& x_nchw, const PoolWindow& window, DType dtype,
                                          Layout layout) {
  const PoolingDescriptor pooling = make_pooling(window);
  const TensorDescriptor x = make_tensor_4d(layout, dtype, x_nchw);
  std::array<int, 4> y{};
  RN_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pooling.get(), x.get(), &y[0], &y[1], &y[2], &y[3]));
  return y;
}

void max_pool2d_forward(const TensorView& x, const TensorView& y, const PoolWindow& window, Layout layout,
                        cudaStream_t stream) {
  const PoolingDescriptor pooling = make_pooling(window);
  const TensorDescriptor x_desc = make_tensor_4d(layout, x.dtype, nchw_dims(x, layout));
  const TensorDescriptor y_desc = make_tensor_4d(layout, y.dtype, nchw_dims(y, layout));
  const float one = 1.0f, zero = 0.0f;
  RN_CUDNN_CHECK(cudnnPoolingForward(cudnn_handle(stream), pooling.get(), &one, x_desc.get(), x.data, &zero,
                                     y_desc.get(), y.data));
}

void max_pool2d_backward(const TensorView& dy, const TensorView& x, const TensorView& y, const TensorView& dx,
                         const PoolWindow& window, Layout layout, cudaStream_t stream) {
  const PoolingDescriptor pooling = make_pooling(window);
  const TensorDescriptor x_desc = make_tensor_4d(layout, x.dtype, nchw_dims(x, layout));
  const TensorDescriptor y_desc = make_tensor_4d(layout, y.dtype, nchw_dims(y, layout));
  const float one = 1.0f, zero = 0.0f;
  RN_CUDNN_CHECK(cudnnPoolingBackward(cudnn_handle(stream), pooling.get(), &one, y_desc.get(), y.data, y_desc.get(),
                                      dy.data, x_desc.get(), x.data, &zero, x_desc.get(), dx.data));
}

}  // namespace rn
