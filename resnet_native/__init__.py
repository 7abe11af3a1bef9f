"""resnet_native: ResNets on cuDNN, called directly from a small C++/CUDA core.

Arrays are cupy arrays (or anything with __cuda_array_interface__ / DLPack). The package's folders are its layers,
each importing only those below it: _core, formats, quantization, reference, ops, distributed, data, nn, optim,
inference, training, release, serve (ARCHITECTURE.md).
"""

from . import _compat
from ._core.loader import _C, CUDNN_LIBRARY, build_info
from ._core.runtime import cuda_available, current_stream, require_gpu
from ._core.version import __version__  # noqa: F401
from .inference import InferenceEngine
from .nn.models import ResNet, ResNet18, ResNet34, ResNet50, ResNet101, ResNet152
from .ops import conv, kernels, multi_tensor, norm, pool  # noqa: F401  (rn.conv, rn.norm, ...: the ops modules)
from .ops.conv import ConvSpec, _drop_cached_descriptors, conv2d, conv_output_shape  # noqa: F401
from .ops.workspace import (
    cudnn_version,
    live_descriptors,
    release_handles,
    release_workspace,
    reserve_workspace,
    set_workspace_limit,
    trim_workspace,
    workspace_limit,
    workspace_stats,
)
from .optim import SGD, AdamW, GradScaler, step  # noqa: F401  (rn.step: the training step's module)
from .optim.step import TrainStep
from .release.classifier import CIFAR10Classifier
from .release.onnx_export import export_onnx  # needs the extra: pip install "resnet_native[onnx]"

CudnnError = _C.CudnnError
CudaError = _C.CudaError
NoGPUError = _C.NoGPUError

_compat.install()

__all__ = [
    "CUDNN_LIBRARY",
    "build_info",
    "CudaError",
    "CudnnError",
    "NoGPUError",
    "cuda_available",
    "cudnn_version",
    "current_stream",
    "live_descriptors",
    "release_handles",
    "release_workspace",
    "require_gpu",
    "reserve_workspace",
    "trim_workspace",
    "set_workspace_limit",
    "workspace_limit",
    "workspace_stats",
    "ResNet", "ResNet18", "ResNet34", "ResNet50", "ResNet101", "ResNet152", "SGD", "AdamW", "GradScaler",
    "TrainStep",
    "InferenceEngine",
    "CIFAR10Classifier",
    "export_onnx",
]
