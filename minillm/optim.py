"""The optimizer's parameter groups and the learning-rate schedules (warmup, then cosine, linear, constant or
inverse square root), with the schedule settings a resumed run must keep."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from minillm.errors import check_choice, check_int, check_number

SCHEDULES = ("cosine", "linear", "constant", "inverse_sqrt")
STEP_FREE_SCHEDULES = ("constant", "inverse_sqrt")  # they ignore total_steps and min_lr_ratio


def schedule_settings(scheduler: dict | None) -> dict:
    """The scheduler settings that decide the lr: without total_steps and min_lr_ratio for the schedules that
    ignore them, so a constant-lr run may be extended (run settings compared on resume)."""
    scheduler = {k: v for k, v in (scheduler or {}).items() if not k.startswith("_")}  # not _target_: code paths
    if scheduler.get("kind") in STEP_FREE_SCHEDULES:
        scheduler = {k: v for k, v in scheduler.items() if k not in ("total_steps", "min_lr_ratio")}
    return scheduler


def lr_lambda(kind: str, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1) -> Callable[[int], float]:
    """Multiplier of the peak lr at a step: linear warmup, then cosine / linear decay to min_lr_ratio,
    constant, or inverse square root (1 / sqrt(step / warmup))."""
    check_choice("scheduler.kind", kind, SCHEDULES)
    check_int("scheduler.warmup_steps", warmup_steps, low=0)
    check_int("scheduler.total_steps", total_steps, low=1)
    check_number("scheduler.min_lr_ratio", min_lr_ratio, low=0.0, high=1.0)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        if kind == "inverse_sqrt":
            return math.sqrt(max(warmup_steps, 1) / (step + 1))
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1 - progress
        return min_lr_ratio + (1 - min_lr_ratio) * shape

    return factor


def warmup_schedule(optimizer: torch.optim.Optimizer, kind: str = "cosine", warmup_steps: int = 100,
                    total_steps: int = 1000, min_lr_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step LambdaLR (the Hydra config passes it as a partial)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(kind, warmup_steps, total_steps, min_lr_ratio))


def param_groups(model: torch.nn.Module, decay_norms: bool = False, decay_embeddings: bool = False) -> list[dict]:
    """AdamW parameter groups: weight decay on the matrices of linear layers; the norm gains and biases (every
    0-D and 1-D parameter) and the token embedding get it only when decay_norms / decay_embeddings say so."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = (p.ndim < 2 and not decay_norms) or (name.startswith("tok_emb.") and not decay_embeddings)
        (no_decay if skip else decay).append(p)
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
