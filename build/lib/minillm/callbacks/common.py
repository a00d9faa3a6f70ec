"""Small helpers the callbacks share: step index, run totals, logging to every logger."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from torch import Tensor


def last_step(trainer: L.Trainer) -> int:
    """0-based index of the last optimizer step taken: the ``step`` of its row in csv/metrics.csv."""
    return max(trainer.global_step - 1, 0)


def finite_max(current: float | None, value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return current
    return value if current is None else max(current, value)


def find_callback(trainer: L.Trainer, kind: type) -> Any:
    return next((c for c in trainer.callbacks if isinstance(c, kind)), None)


def log_metrics(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def train_loss(outputs: Any) -> Tensor | None:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss if isinstance(loss, Tensor) else None

