"""The decoder's sublayers: rotary positions (RoPE), grouped-query causal attention through SDPA (with the QK/V-norm
forms, soft-caps and the softmax scale of minillm.model_config) and the SwiGLU feed-forward."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minillm import mup
from minillm.errors import ConfigError
from minillm.generation import KVCache
from minillm.model_config import ModelConfig
from minillm.ngpt import Scaled, normalized_qk
from minillm.norms.qk import build_qk_norm, henry_temperature, value_norm


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, each (max_seq_len, head_dim // 2), fp32."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)  # (T, D/2)
    return angles.cos().float(), angles.sin().float()


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """Gemma 2's logit soft-cap: cap * tanh(x / cap), computed in fp32, in x's dtype. About x for |x| << cap, and
    never beyond +-cap: the attention scores or output logits can grow without a softmax saturating."""
    return (cap * torch.tanh(x.float() / cap)).to(x.dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x[..., i], x[..., i + D/2]) of x (B, T, H, D) by the angle of their position."""
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, T, H, D/2) each
    cos, sin = cos[:, None, :], sin[:, None, :]  # (T, 1, D/2)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


def at_positions(norm: nn.Module | None, start: int):
    """norm for an input whose first position is ``start``: norms with per-position statistics (BatchNorm,
    PowerNorm) index their rows from 0, so the input is left-padded with ``start`` zero positions (eval mode)."""
    if norm is None or start == 0 or not getattr(norm, "uses_positions", False):
        return norm

    def shifted(x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        pad = x.new_zeros(x.shape[0], start, x.shape[2])
        return norm(torch.cat((pad, x), dim=1))[:, start:]
    return shifted


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads, optional QK- and V-norms (minillm.norms.qk) and RoPE; with
    ``attn_logit_softcap`` the scores q.k * scale are soft-capped before the softmax (computed explicitly, in fp32:
    SDPA has no soft-cap). ``scale`` is None for SDPA's 1 / sqrt(D), or model.attn_scale; with Henry's L2 QK-norm the
    queries are multiplied by the learned ``temperature`` and the scale is 1."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.softcap = cfg.attn_logit_softcap
        # None: 1/sqrt(head_dim); model.attn_scale, else muP's (minillm.mup)
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else mup.attention_scale(cfg)
        self.flat_qk_norm = cfg.qk_norm_axis == "flat"
        self.q_norm, self.k_norm = self.qk_norm(cfg, cfg.n_heads, "q"), self.qk_norm(cfg, cfg.n_kv_heads, "k")
        self.v_norm = value_norm(cfg.head_dim, cfg.norm_eps) if cfg.v_norm else nn.Identity()
        self.temperature = None
        if cfg.qk_norm == "l2":  # Henry et al. 2020: softmax(g q.k) over unit q, k; g replaces 1 / sqrt(D)
            self.temperature = nn.Parameter(torch.full((1,), henry_temperature(cfg.max_seq_len)))
            self.scale = 1.0
        self.s_qk = Scaled(cfg.n_heads * cfg.head_dim, 1.0, cfg.dim**-0.5) if cfg.ngpt else None
        if cfg.ngpt:  # s_qk * unit(q), s_qk * unit(k) after RoPE; softmax scale sqrt(D)
            self.scale = math.sqrt(cfg.head_dim)

    @staticmethod
    def qk_norm(cfg: ModelConfig, heads: int, which: str) -> nn.Module:
        """The norm of the queries (which="q") or keys ("k"), or Identity."""
        if cfg.qk_norm == "none" or (which == "q" and cfg.qk_norm_on == "k"):
            return nn.Identity()
        gains = cfg.qk_norm_gains or ("per_head" if cfg.qk_norm_axis == "flat" else "shared")
        try:
            return build_qk_norm(cfg.qk_norm, heads, cfg.head_dim, cfg.qk_norm_axis, gains, cfg.norm_eps,
                                 cfg.norm_impl, dict(cfg.qk_norm_options))
        except ConfigError as err:
            raise ConfigError(f"model.qk_norm_options ({cfg.qk_norm}): {err}") from None

    def _normed(self, norm: nn.Module, x: Tensor, heads: int) -> Tensor:
        """x (B, T, heads * D) -> (B, T, heads, D), normalized per head or over all heads (flat)."""
        if self.flat_qk_norm:
            x = norm(x)
        x = x.view(*x.shape[:2], heads, self.head_dim)
        return x if self.flat_qk_norm else norm(x)

    def qk(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Queries (B, H, T, D) and keys (B, Hkv, T, D) as attention sees them (also used by probes); Henry's
        temperature is in the queries."""
        q = self._normed(self.q_norm, self.wq(x), self.n_heads)  # (B, T, H, D)
        k = self._normed(self.k_norm, self.wk(x), self.n_kv_heads)  # (B, T, Hkv, D)
        if self.temperature is not None:
            q = q * self.temperature.to(q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.s_qk is not None:
            q, k = normalized_qk(q, k, self.s_qk().view(self.n_heads, self.head_dim))
        return q.transpose(1, 2), k.transpose(1, 2)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None = None) -> Tensor:
        B, T, C = x.shape
        q, k = self.qk(x, cos, sin)
        v = self.v_norm(self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)).transpose(1, 2)  # (B, Hkv, T, D)
        start, mask = 0, None
        if cache is not None:  # queries at positions start..start+T-1 see every key up to their own position
            start = cache.length
            k, v = cache.update(k, v)  # (B, Hkv, start + T, D)
            if start and T > 1:
                mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(start)  # (T, S)
        if self.softcap is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=start == 0, scale=self.scale,
                                               enable_gqa=self.n_kv_heads != self.n_heads)  # (B, H, T, D)
        else:
            if start == 0:
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = self.capped_attention(q, k, v, mask)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))

    def capped_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """softmax(softcap(q k^T * scale) masked) v for q (B, H, T, D), k and v (B, Hkv, S, D), mask (T, S) of
        the allowed pairs or None (all); returns (B, H, T, D) in v's dtype."""
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, S, D)
        with torch.autocast(q.device.type, enabled=False):  # fp32 scores even under autocast, which would make bf16
            scores = q.float() @ k.float().transpose(-2, -1)
            scores = soft_cap(scores / math.sqrt(self.head_dim) if self.scale is None else scores * self.scale,
                              self.softcap)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))  # (B, H, T, S)
            return (scores.softmax(dim=-1) @ v.float()).to(v.dtype)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); with ``ngpt``, nGPT's scaled inputs w2(silu(s_v sqrt(C) w1 x) * s_u sqrt(C) w3 x)
    (s_u, s_v start at 1)."""

    def __init__(self, dim: int, hidden: int, ngpt: bool = False):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.s_u, self.s_v = (Scaled(hidden, 1.0, 1.0), Scaled(hidden, 1.0, 1.0)) if ngpt else (None, None)
        self.input_scale = math.sqrt(dim)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w1(x), self.w3(x)
        if self.s_u is not None:
            gate = gate * (self.s_v() * self.input_scale).to(gate.dtype)
            up = up * (self.s_u() * self.input_scale).to(up.dtype)
        return self.w2(F.silu(gate) * up)
