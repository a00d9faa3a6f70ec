"""Cross-process batch statistics for the batch-statistics norms (BatchNorm, PowerNorm), like SyncBatchNorm.

Plain PyTorch (no Lightning): Lightning's DDP/FSDP strategies set up the default process group and the norms
call these helpers when built with ``sync=True``. Outside a process group (one process, a notebook) every
helper reduces locally, so the same code runs everywhere.

The forward all-reduce is differentiable: its backward all-reduces (sums) the gradients too, so each process
gets the gradient of the *global* batch statistics, as one process would on the concatenated batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from minillm import _compat


def world_size() -> int:
    """Processes in the default group (1 when torch.distributed is not initialized)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


def all_reduce_sum(t: Tensor) -> Tensor:
    """Sum of t over processes, differentiable (backward: sum of the gradients over processes)."""
    if world_size() == 1:
        return t
    if not torch.is_grad_enabled() or not t.requires_grad:
        out = t.detach().clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out)
        return out
    return _compat.all_reduce_sum_differentiable(t)


def _count(x: Tensor, dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= x.shape[d]
    return n


def global_mean(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Mean of x over dims of the union of every process's batch (one all-reduce of [sum, count])."""
    s = x.sum(dims)
    n = torch.full((1,), float(_count(x, dims)), dtype=s.dtype, device=s.device)
    red = all_reduce_sum(torch.cat([s.flatten(), n]))
    return red[:-1].view_as(s) / red[-1]


def global_mean_var(x: Tensor, dims: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Mean and biased variance of x over dims of every process's batch, from one all-reduce of the sums,
    the sums of squares and the counts (var = E[x^2] - E[x]^2, in x's dtype: pass fp32)."""
    s, ss = x.sum(dims), (x * x).sum(dims)
    n = torch.full((1,), float(_count(x, dims)), dtype=s.dtype, device=s.device)
    red = all_reduce_sum(torch.cat([s.flatten(), ss.flatten(), n]))
    k = s.numel()
    mu = red[:k].view_as(s) / red[-1]
    var = (red[k:2 * k].view_as(s) / red[-1] - mu * mu).clamp_min(0.0)
    return mu, var


def is_synced(sync: bool) -> bool:
    """Whether a norm built with ``sync`` reduces across processes now (sync on and more than one process)."""
    return sync and world_size() > 1


def batch_mean(x: Tensor, dims: tuple[int, ...], sync: bool = False) -> Tensor:
    """x.mean(dims), over every process's batch when ``sync`` and distributed (differentiable)."""
    return global_mean(x, dims) if is_synced(sync) else x.mean(dims)
