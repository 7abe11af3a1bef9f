"""resnet_native.inference: a trained ResNet served fast.

InferenceEngine folds every BatchNorm into its convolution, runs each convolution as one fused conv + bias
(+ residual) (+ ReLU) call where that is faster, keeps activations in a few buffers shared by liveness, and
replays the whole forward from one CUDA graph per batch size; it takes uint8 pixels or normalised batches.
The pieces are usable on their own: fold (BN folding), plan (the step list of a ResNet, host only), buffers
(liveness assignment), input_stage (the uint8 normalisation kernel), tuning (fused or unfused), choice_cache
(quantize_from='auto''s choice in the algorithm cache file); the capture itself is _core/capture.py, shared
with the training step.
"""

from .buffers import BufferAssignment, assign_buffers, live_ranges, plan_buffers
from .engine import DEFAULT_BATCH_SIZES, InferenceEngine
from .fold import BN_EPS, filter_in_layout, fold_batch_norm
from .input_stage import normalize_u8
from .plan import Plan, build_plan
from .source import model_source

__all__ = [
    "BN_EPS",
    "BufferAssignment",
    "DEFAULT_BATCH_SIZES",
    "InferenceEngine",
    "Plan",
    "assign_buffers",
    "build_plan",
    "filter_in_layout",
    "fold_batch_norm",
    "live_ranges",
    "model_source",
    "normalize_u8",
    "plan_buffers",
]
