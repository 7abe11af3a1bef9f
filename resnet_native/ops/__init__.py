"""The ops: thin wrappers of the native core (resnet_native._C), the only modules above _core that call it.

Each takes device arrays (cupy, __cuda_array_interface__ or DLPack) and hands NumPy arrays to its float64 twin in
resnet_native.reference, so the same graph runs on the host. Ops never allocate when given their outputs and never
synchronise: whole forwards and steps are captured in CUDA graphs.
"""

from . import (  # noqa: F401
    conv,
    images,
    kernels,
    linear,
    losses,
    multi_tensor,
    norm,
    own_conv,
    pool,
    quantized_conv,
    workspace,
)
