"""The training loss from the model's last hidden states: next-token cross entropy (+ z-loss), the output logits
soft-capped when the model caps them, without the fp32 logits of the whole batch.

    loss, ce = linear_cross_entropy(h, weight, y, impl="chunked", z_loss=1e-4, softcap=30.0)

``impl``:
  plain    logits = h @ weight.T for the whole batch, cast to fp32, then F.cross_entropy: what the model's forward
           and an eager loss do. For a 125M model at batch 8 x 1024 with a 32K vocabulary that is 1 GiB of fp32
           logits, written, read, and again for their gradient: some 10 GB of memory traffic per step.
  chunked  the rows in chunks of ``chunk_rows``: each chunk's logits, their log-sum-exp, the loss and the gradient
           of the logits at once, which go straight into the gradients of h and of the weight (two matmuls, as the
           backward would do them); only one chunk's logits exist at a time. The backward multiplies the saved
           gradients by the incoming scalar. Plain PyTorch ops in an autograd.Function, so torch.compile traces
           it (the loop over chunks unrolls: the shapes are static).
  liger    Liger-Kernel's fused linear cross entropy (Triton; when liger_kernel imports and the device is CUDA).

Every impl gives the same loss and gradients within rounding (tests/test_loss.py, fp32 and bf16): the cross entropy
mean over every target (no ignored index), z-loss ``z_loss * mean(logsumexp(logits) ** 2)``, and with ``softcap``
the logits ``softcap * tanh(logits / softcap)`` computed as the model's soft_cap does. Under autocast the matmuls run
in the autocast dtype, as the model's lm_head does; the softmax and the sums in fp32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from minillm.errors import ConfigError

IMPLS = ("plain", "chunked", "liger")
CHUNK_ELEMENTS = 2**25  # logits per chunk (128 MiB in fp32) when chunk_rows is not given


def default_chunk_rows(vocab_size: int, rows: int) -> int:
    """Rows per chunk: about CHUNK_ELEMENTS logits, a multiple of 64, at most the rows there are."""
    return max(1, min(rows, max(64, (CHUNK_ELEMENTS // vocab_size) // 64 * 64)))


def _capped(z: Tensor, softcap: float | None) -> Tensor:
    """The model's soft cap (minillm.model.soft_cap: in fp32, back to z's dtype), or z."""
    return z if softcap is None else (softcap * torch.tanh(z.float() / softcap)).to(z.dtype)


def plain(h: Tensor, weight: Tensor, y: Tensor, z_loss: float = 0.0, softcap: float | None = None
          ) -> tuple[Tensor, Tensor]:
    """(loss, ce) from the whole batch's logits in fp32: h (N, C), weight (V, C), y (N,)."""
    logits = _capped(h @ weight.t(), softcap).float()  # (N, V)
    ce = F.cross_entropy(logits, y)
    if not z_loss:
        return ce, ce
    return ce + z_loss * torch.logsumexp(logits, dim=-1).pow(2).mean(), ce


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Forward: the loss and, chunk by chunk, the gradients of h and weight for an incoming gradient of 1. Backward:
    those gradients times the incoming one. ce is returned for logging and has no gradient."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, y: Tensor, z_loss: float, softcap: float | None,
                chunk_rows: int) -> tuple[Tensor, Tensor]:
        n = h.shape[0]
        grad_h = torch.empty_like(h)  # (N, C)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)  # (V, C)
        ce_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        z_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        for start in range(0, n, chunk_rows):
            h_c, y_c = h[start:start + chunk_rows], y[start:start + chunk_rows]  # (n_c, C), (n_c,)
            raw = h_c @ weight.t()  # (n_c, V), autocast's dtype under autocast, as the model's lm_head
            z = _capped(raw, softcap).float()
            lse = torch.logsumexp(z, dim=-1)  # (n_c,)
            target = z.gather(1, y_c[:, None]).squeeze(1)  # (n_c,)
            ce_sum = ce_sum + (lse - target).sum()
            # d loss / d z = (softmax(z) * (1 + 2 z_loss lse) - onehot(y)) / N: softmax reused in place
            dz = torch.exp(z - lse[:, None])  # (n_c, V)
            if z_loss:
                z_sum = z_sum + lse.pow(2).sum()
                dz = dz * (1 + 2 * z_loss * lse)[:, None]
            dz.scatter_add_(1, y_c[:, None], torch.full_like(target[:, None], -1.0))
            dz = dz / n
            if softcap is not None:  # through cap * tanh(raw / cap): times 1 - tanh^2
                dz = dz * (1 - (z / softcap).pow(2))
            dz = dz.to(raw.dtype)
            grad_h[start:start + chunk_rows] = dz @ weight.to(raw.dtype)  # (n_c, C)
            grad_w += (dz.t() @ h_c.to(raw.dtype)).float()  # (V, C), summed in fp32 over the chunks
        ce = ce_sum / n
        loss = ce + z_loss * z_sum / n if z_loss else ce.clone()
        ctx.mark_non_differentiable(ce)
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return loss, ce

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_ce: Tensor | None):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype), None, None, None, None


def chunked(h: Tensor, weight: Tensor, y: Tensor, z_loss: float = 0.0, softcap: float | None = None,
            chunk_rows: int | None = None) -> tuple[Tensor, Tensor]:
    """(loss, ce) without the fp32 logits of the whole batch (module docstring)."""
    rows = chunk_rows or default_chunk_rows(weight.shape[0], h.shape[0])
    if not torch.is_grad_enabled() or not (h.requires_grad or weight.requires_grad):
        with torch.no_grad():  # evaluation: the chunks' losses alone
            parts = [plain(h[i:i + rows], weight, y[i:i + rows], z_loss, softcap) for i in range(0, h.shape[0], rows)]
            w = [min(rows, h.shape[0] - i) / h.shape[0] for i in range(0, h.shape[0], rows)]
            return tuple(sum(p[k] * f for p, f in zip(parts, w, strict=True)) for k in (0, 1))
    return _ChunkedLinearCrossEntropy.apply(h, weight, y, float(z_loss), softcap, rows)


def liger(h: Tensor, weight: Tensor, y: Tensor, z_loss: float = 0.0, softcap: float | None = None
          ) -> tuple[Tensor, Tensor]:
    """(loss, ce) by Liger-Kernel's fused linear cross entropy."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    loss, z_part = liger_fused_linear_cross_entropy(h, weight, y, lse_square_scale=z_loss, softcap=softcap,
                                                    return_z_loss=True)
    return loss, (loss - z_part).detach() if z_loss else loss.detach()


def check_impl(impl: str, device: torch.device | str | None = None) -> None:
    """A one-line ConfigError for an impl this machine cannot run (liger without its package or a GPU)."""
    if impl not in IMPLS:
        raise ConfigError(f"module.loss_impl={impl!r} is not one of: {', '.join(IMPLS)}, auto")
    if impl == "liger":
        try:
            import liger_kernel.transformers.functional  # noqa: F401
        except ImportError as e:
            raise ConfigError(f"module.loss_impl=liger needs Liger-Kernel, which does not import here ({e}): "
                              "pip install liger-kernel, or use module.loss_impl=chunked") from None
        if device is not None and torch.device(device).type != "cuda":
            raise ConfigError("module.loss_impl=liger runs on a CUDA GPU only; allowed here: plain, chunked")


def linear_cross_entropy(h: Tensor, weight: Tensor, y: Tensor, impl: str = "chunked", z_loss: float = 0.0,
                         softcap: float | None = None, chunk_rows: int | None = None) -> tuple[Tensor, Tensor]:
    """(loss to minimize, cross entropy) of the next-token targets y (...,) from the last hidden states h (..., C)
    and the output weight (V, C): loss = ce + z_loss * mean(log Z ** 2)."""
    h2, y2 = h.reshape(-1, h.shape[-1]), y.reshape(-1)  # (N, C), (N,)
    if impl == "plain":
        return plain(h2, weight, y2, z_loss, softcap)
    if impl == "chunked":
        return chunked(h2, weight, y2, z_loss, softcap, chunk_rows)
    if impl == "liger":
        return liger(h2, weight, y2, z_loss, softcap)
    raise ConfigError(f"module.loss_impl={impl!r} is not one of: {', '.join(IMPLS)}")


def logits_traffic_gib(tokens: int, vocab_size: int) -> float:
    """GiB the plain loss moves for the fp32 logits alone: written once, read by the softmax, their gradient
    written and read (4 x 4 bytes per logit), not counting the matmul's own bf16 output."""
    return 16 * tokens * vocab_size / 2**30 if tokens and vocab_size else math.nan
