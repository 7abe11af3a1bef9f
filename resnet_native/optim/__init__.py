"""Optimizers (fused multi-tensor SGD and AdamW), learning-rate schedules and fp16 loss scaling."""

from .adamw import AdamW
from .grad_scaler import GradScaler
from .optimizer import Optimizer
from .schedules import CosineSchedule, OneCycleSchedule, Schedule, WarmupSchedule
from .sgd import SGD

__all__ = [
    "SGD",
    "AdamW",
    "CosineSchedule",
    "GradScaler",
    "OneCycleSchedule",
    "Optimizer",
    "Schedule",
    "WarmupSchedule",
]
