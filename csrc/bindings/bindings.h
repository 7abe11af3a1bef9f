// Each part of the extension registers its Python functions in its own bind_*.cpp; module.cpp calls them all
// (and testing/bind_testing.h's, which fill resnet_native._C._testing).
#pragma once

#include <pybind11/pybind11.h>

namespace rn {

void bind_enums(pybind11::module_& m);           // typed enums shared by every op (DType, Precision, Layout, ...)
void bind_core(pybind11::module_& m);            // errors, version, devices, handles, timing, workspace
void bind_conv(pybind11::module_& m);            // convolution specs and ops
void bind_algo_cache(pybind11::module_& m);      // algorithm cache (keys, entries), cached descriptors and plans
void bind_kernels(pybind11::module_& m);         // elementwise kernels, cast, cudnnAddTensor
void bind_multi_tensor(pybind11::module_& m);    // TensorTable and the multi-tensor optimizer kernels
void bind_norm(pybind11::module_& m);            // batch norm
void bind_pool(pybind11::module_& m);            // max / global-average pooling
void bind_graph_engine(pybind11::module_& m);    // graph-engine plan cache
void bind_inference(pybind11::module_& m);       // the inference engine's uint8 input stage
void bind_augment(pybind11::module_& m);         // the training pipeline's augmentation kernel
void bind_linear(pybind11::module_& m);          // the fully connected layer's three products
void bind_loss(pybind11::module_& m);            // softmax cross-entropy forward and backward
void bind_device_scalars(pybind11::module_& m);  // learning-rate writes, step count, loss scale
void bind_own_conv(pybind11::module_& m);        // the own convolution kernels (csrc/ownconv/)

// build_info()'s "own_conv_kernels": {built, reason, cutlass, kernels} (bind_own_conv.cpp).
pybind11::dict own_conv_build_status();

}  // namespace rn
