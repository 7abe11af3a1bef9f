// resnet_native._C: the compiled core. The Python package wraps these functions; users rarely call them directly.
#include <pybind11/pybind11.h>

#include "../testing/bind_testing.h"
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "resnet_native native core: cuDNN handle, descriptors, workspace pool, convolution and kernels";
  rn::bind_enums(m);
  rn::bind_core(m);
  rn::bind_conv(m);
  rn::bind_algo_cache(m);
  rn::bind_kernels(m);
  rn::bind_multi_tensor(m);
  rn::bind_norm(m);
  rn::bind_pool(m);
  rn::bind_graph_engine(m);
  rn::bind_inference(m);
  rn::bind_augment(m);
  rn::bind_linear(m);
  rn::bind_loss(m);
  rn::bind_device_scalars(m);
  rn::bind_own_conv(m);
  rn::bind_testing(m);
}
