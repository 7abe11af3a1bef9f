"""Float64 NumPy twins of the native ops, with the same signatures: the host implementation of the package.

One module per op family (conv, norm, pool, kernels, linear, loss, multi_tensor), beside bf16 (bfloat16 rounding on
uint16 bit patterns), storage (how arrays are read and written; to_storage / from_storage / relative_error for GPU
tests) and layout (NCHW / NHWC). Three uses: a model on the host (model.to_host(np.float64); every op in
resnet_native.ops hands NumPy arrays to its twin here in its first line, so layers, optimizers and TrainStep run on
the CPU and a release predicts without a GPU), the reference the GPU tests compare with, and the plain definition of
each op.

Each function computes in float64 and rounds once to its outputs' storage dtypes: what an exact fp16 or bf16
computation would give, the standard the native results are held to. It checks what the wiring of a graph needs
as the native ops do (array kinds, shapes, dtypes, layouts: errors name the argument). Nothing here imports the
native core, cupy or a GPU.
"""

from . import bf16, conv, kernels, linear, loss, multi_tensor, norm, pool, storage
from .storage import from_storage, relative_error, to_storage

__all__ = ["bf16", "conv", "from_storage", "kernels", "linear", "loss", "multi_tensor", "norm", "pool",
           "relative_error", "storage", "to_storage"]
