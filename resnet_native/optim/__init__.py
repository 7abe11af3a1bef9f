"""Optimizers (fused multi-tensor SGD and AdamW), learning-rate schedules, fp16 loss scaling and the training step
(TrainStep: forward, loss, backward and update, captured as one CUDA graph), the weights' moving average
(WeightAverage) and Lookahead's slow weights."""

from .adamw import AdamW
from .ema import WeightAverage
from .grad_scaler import GradScaler
from .lookahead import Lookahead
from .optimizer import Optimizer
from .schedules import CosineSchedule, LinearSchedule, OneCycleSchedule, Schedule, WarmupSchedule
from .sgd import SGD
from .step import TrainStep

__all__ = [
    "SGD",
    "AdamW",
    "CosineSchedule",
    "GradScaler",
    "LinearSchedule",
    "Lookahead",
    "OneCycleSchedule",
    "Optimizer",
    "Schedule",
    "TrainStep",
    "WarmupSchedule",
    "WeightAverage",
]
