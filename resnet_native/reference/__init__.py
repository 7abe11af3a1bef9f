"""Float64 NumPy references of the native ops, with the same signatures: the host implementation of the package.

    reference.conv          conv_output_shape, conv2d (+ bias, residual, ReLU), conv2d_backward_data / _filter
    reference.norm          batch_norm_train (+ residual, ReLU), batch_norm_infer, batch_norm_backward
    reference.pool          max_pool2d (+ output shape, backward), global_avg_pool (+ backward)
    reference.kernels       add, add_relu, relu and their backward, cast
    reference.loss          cross_entropy_forward / cross_entropy_backward (softmax cross-entropy)
    reference.multi_tensor  TensorList, sgd_step, adamw_step, check_finite, zero_, scale_, write_scalars,
                            advance_step
    reference.bf16          to_bf16_bits / from_bf16_bits: bfloat16 rounding (uint16 bit patterns)
    reference.storage       how these read and write storage arrays; to_storage / from_storage / relative_error
    reference.layout        the NCHW / NHWC conversions they share

Three uses:
- a model on the host: model.to_host(np.float64) puts its masters, gradients and buffers in NumPy, and every native
  op function (resnet_native.conv.conv2d, norm.batch_norm_train, ...) hands NumPy arrays to its reference here in
  its first line. So the whole graph (layers, ResNets, optimizers, loss scaling, TrainStep) runs on the CPU, which
  the CPU tests check with finite differences, and a released model can predict without a GPU;
- the reference GPU tests compare the native ops, layers and models with (on host copies of the same values);
- the definition of what each op computes, in plain NumPy.

Each function computes in float64 from the values its inputs hold and rounds once to its outputs' storage dtypes.
It checks what matters for the wiring of a graph as the native ops do (array kinds, shapes, dtypes, layouts: a
ValueError or TypeError naming the argument) but does not emulate reduced-precision arithmetic: its results are
what an exact fp16 or bf16 computation would round to, the standard the native results are held to. Nothing here
imports the native core, cupy or a GPU.
"""

from . import bf16, conv, kernels, loss, multi_tensor, norm, pool, storage
from .storage import from_storage, relative_error, to_storage

__all__ = ["bf16", "conv", "from_storage", "kernels", "loss", "multi_tensor", "norm", "pool", "relative_error",
           "storage", "to_storage"]
