"""The norms of the attention's queries, keys and values (``model.qk_norm``, ``model.v_norm``).

    qk_norm=rmsnorm | layernorm   q <- norm(q), k <- norm(k), then softmax(q k^T * scale): the ViT-22B / Qwen3 form
                                  (over each head's D features, qk_norm_axis=head) or OLMo 2's (over the flattened
                                  projection of all heads, qk_norm_axis=flat)
    qk_norm=l2                    Henry et al. 2020: q <- q / ||q||, k <- k / ||k|| per head, then softmax(g q k^T)
                                  with one learned temperature g per layer instead of 1 / sqrt(D)
    v_norm                        v <- v / rms(v) per head, no gain (Gemma 3n's value norm)

The gains of a per-head norm are one D-vector shared by the heads (``qk_norm_gains=shared``, as Qwen3) or one per
head (``per_head``, H x D); the flattened norm has H x D gains by construction.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from minillm.errors import ConfigError
from minillm.norms import build_norm

QK_NORMS = ("none", "rmsnorm", "layernorm", "l2")
QK_AXES = ("head", "flat")
QK_GAINS = ("shared", "per_head")
QK_SITES = ("qk", "k")  # normalize queries and keys, or the keys alone
AFFINE_OPTIONS = ("affine", "bias", "zero_centered")  # what PerHeadGains holds instead of the per-head norm


def henry_temperature(max_seq_len: int) -> float:
    """Henry et al.'s initial temperature g0 = log2(L^2 - L) for sequences of length L (here max_seq_len)."""
    return math.log2(max(max_seq_len**2 - max_seq_len, 2))


class L2Norm(nn.Module):
    """x / max(||x||_2, eps) over the last dim, in fp32, in x's dtype; no parameters (Henry et al.'s q and k)."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        return (x32 / torch.linalg.vector_norm(x32, dim=-1, keepdim=True).clamp_min(self.eps)).to(x.dtype)


class PerHeadGains(nn.Module):
    """A norm over each head's D features without gains (``norm``), then a gain ``weight`` (and a ``bias`` for
    LayerNorm) of shape (H, D): one per head and feature. Input and output (B, T, H, D)."""

    def __init__(self, norm: nn.Module, heads: int, head_dim: int, bias: bool):
        super().__init__()
        self.norm = norm
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim)) if bias else None

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(x).float() * self.weight.float()
        return (y if self.bias is None else y + self.bias.float()).to(x.dtype)


def build_qk_norm(kind: str, heads: int, head_dim: int, axis: str, gains: str, eps: float, impl: str,
                  options: dict) -> nn.Module:
    """The norm of one of q (heads = n_heads) or k (n_kv_heads): for an input (B, T, H, D) with axis=head, or
    (B, T, H * D) with axis=flat. ``options`` are model.qk_norm_options."""
    if kind == "l2":
        return L2Norm()
    if axis == "flat":
        return build_norm(kind, heads * head_dim, eps, impl=impl, **options)
    if gains == "shared":
        return build_norm(kind, head_dim, eps, impl=impl, **options)
    held = sorted(set(options) & set(AFFINE_OPTIONS))
    if held:
        raise ConfigError(f"model.qk_norm_options {held} do not apply with model.qk_norm_gains=per_head (its gains "
                          f"are plain (H, D) parameters); allowed: the other options of {kind}")
    norm = build_norm(kind, head_dim, eps, impl=impl, affine=False, **options)
    return PerHeadGains(norm, heads, head_dim, bias=kind == "layernorm")


def value_norm(head_dim: int, eps: float) -> nn.Module:
    """Gemma 3n's value norm: RMSNorm over each head's D features, no gain."""
    return build_norm("rmsnorm", head_dim, eps, affine=False)
