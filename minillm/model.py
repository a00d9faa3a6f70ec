"""A LLaMA-style decoder: RoPE, grouped-query causal attention (SDPA), SwiGLU, no biases in linears (but the
query, key and value projections with qkv_bias, as Qwen2 has).

The norm (``ModelConfig.norm``) and where it sits (``ModelConfig.placement``) are chosen by name.
Plain PyTorch: ``Transformer(ModelConfig(vocab_size=65))`` works in a notebook.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minillm.errors import ConfigError, check_bool, check_choice, check_int, check_number, invalid
from minillm.generation import KVCache, generate
from minillm.ngpt import NormalizedResidual, Scaled, normalize_, normalized_qk
from minillm.norms import IMPLS, NORMS, build_norm, norm_options
from minillm.norms.qk import QK_AXES, QK_GAINS, QK_NORMS, QK_SITES, build_qk_norm, henry_temperature, value_norm
from minillm.placements import BRANCH_SCALES, ResidualGain
from minillm.placements import PLACEMENTS as LAYER_PLACEMENTS
from minillm.placements import get as get_placement

BLOCK_PLACEMENTS = tuple(LAYER_PLACEMENTS)  # what one layer can be (minillm.placements)
PLACEMENTS = (*BLOCK_PLACEMENTS, "mix")  # mix: post in the first layers, pre after
INITS = ("auto", "gpt2", "xavier", "small", "deepnet")


@dataclass
class ModelConfig:
    vocab_size: int = 256
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: same as n_heads (no grouping)
    max_seq_len: int = 64
    norm: str = "rmsnorm"
    norm_eps: float = 1e-5
    norm_options: dict = field(default_factory=dict)  # passed to build_norm, e.g. {"eps_mode": "outside"}
    attn_norm_options: dict = field(default_factory=dict)  # the attention sublayer's norm: these over norm_options
    norm_impl: str = "auto"  # how the norms are computed: auto | reference | torch | compiled | triton (norms/impl.py)
    placement: str = "pre"
    mix_fraction: float = 0.25  # placement="mix": Post-LN in the first floor(fraction * n_layers) layers
    layernorm_scaling: bool = False  # LayerNorm Scaling (Sun et al. 2025): input norm of layer l times 1/sqrt(l)
    layers: list[dict] | None = None  # per-layer overrides: [{"placement": "post", "norm": "layernorm"}, ...]
    qk_norm: str = "none"  # none | rmsnorm | layernorm | l2: the norm of queries and keys, before RoPE (norms/qk.py)
    qk_norm_options: dict = field(default_factory=dict)  # options of the QK-norm (the main norm's are its own)
    qk_norm_axis: str = "head"  # head: over each head's D features; flat: over all heads' H * D (OLMo 2)
    qk_norm_gains: str | None = None  # shared: one D gain for all heads | per_head: H x D; None: shared, flat per_head
    qk_norm_on: str = "qk"  # qk: queries and keys | k: the keys alone
    v_norm: bool = False  # values divided by their RMS per head, no gain (Gemma 3n)
    attn_scale: float | None = None  # the softmax's scale of q.k; None: 1 / sqrt(D) (qk_norm=l2: its temperature)
    embed_scale: bool = False  # the embeddings times a learnable scalar, init sqrt(dim) (DyT's and Derf's LLM recipe)
    embed_norm: bool = False  # the norm (model.norm) applied to the embeddings (BLOOM's embedding LayerNorm)
    final_norm: bool | None = None  # the norm before the LM head; None: when the last layer does not end in one
    branch_scale: str = "none"  # none | rezero | layerscale: a learnable multiplier of each sublayer's branch
    branch_scale_init: float | None = None  # its initial value; None: rezero 0, layerscale CaiT's by depth
    layer_output_scale: bool = False  # each layer's output times a learnable scalar, init 1
    ngpt: bool = False  # nGPT (Loshchilov et al. 2025): everything on the unit sphere (minillm.ngpt); norm=none
    ffn_hidden: int | None = None  # None: LLaMA's 8/3 * dim rounded up to multiple_of
    multiple_of: int = 32
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    init: str = "auto"  # auto | gpt2 | xavier | small | deepnet (Transformer.init_weights)
    init_std: float = 0.02
    depth_scaled_init: bool = True  # gpt2: residual projections (attn.wo, ffn.w2) get init_std / sqrt(2 * n_layers)
    qkv_bias: bool = False  # biases on the query, key and value projections (Qwen2; minillm-import), init 0
    attn_logit_softcap: float | None = None  # Gemma 2: attention scores c * tanh(s / c) before the softmax (50.0)
    final_logit_softcap: float | None = None  # Gemma 2: output logits c * tanh(z / c) (30.0)

    def __post_init__(self):
        def fail(name: str, value, allowed: str):
            raise invalid(f"model.{name}", value, allowed)

        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len", "multiple_of"):
            check_int(f"model.{name}", getattr(self, name), low=1)
        check_int("model.n_kv_heads", self.n_kv_heads, low=1, optional=True)
        check_int("model.ffn_hidden", self.ffn_hidden, low=1, optional=True)
        for name in ("norm_eps", "init_std"):
            check_number(f"model.{name}", getattr(self, name), low=0.0)
        check_number("model.rope_theta", self.rope_theta, low=0.0, low_open=True)
        for name in ("attn_logit_softcap", "final_logit_softcap"):
            check_number(f"model.{name}", getattr(self, name), low=0.0, low_open=True, optional=True)
        check_number("model.mix_fraction", self.mix_fraction, low=0.0, high=1.0)
        for name in ("tie_embeddings", "depth_scaled_init", "layernorm_scaling", "qkv_bias", "v_norm",
                     "embed_scale", "embed_norm", "layer_output_scale", "ngpt"):
            check_bool(f"model.{name}", getattr(self, name))
        if self.final_norm is not None:
            check_bool("model.final_norm", self.final_norm)
        check_number("model.attn_scale", self.attn_scale, low=0.0, low_open=True, optional=True)
        check_number("model.branch_scale_init", self.branch_scale_init, optional=True)
        for name in ("norm_options", "attn_norm_options", "qk_norm_options"):
            if not isinstance(getattr(self, name), Mapping):
                fail(name, getattr(self, name), "a mapping of a norm's options, e.g. {eps_mode: outside}")
        check_choice("model.norm", self.norm, sorted(NORMS))
        check_choice("model.norm_impl", self.norm_impl, IMPLS)
        check_choice("model.placement", self.placement, (*LAYER_PLACEMENTS, "mix"))  # the registry as it is now
        check_choice("model.qk_norm", self.qk_norm, QK_NORMS)
        check_choice("model.qk_norm_axis", self.qk_norm_axis, QK_AXES)
        check_choice("model.qk_norm_gains", self.qk_norm_gains, (*QK_GAINS, None))
        check_choice("model.qk_norm_on", self.qk_norm_on, QK_SITES)
        check_choice("model.branch_scale", self.branch_scale, BRANCH_SCALES)
        self._check_qk_norm()
        check_choice("model.init", self.init, INITS)
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.dim % self.n_heads:
            fail("dim", self.dim, f"a multiple of n_heads={self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            fail("dim", self.dim, f"an even head dim dim/n_heads for RoPE (here {self.dim // self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            fail("n_kv_heads", self.n_kv_heads, f"a divisor of n_heads={self.n_heads}")
        if self.placement == "mix" and not 0 < self.mix_post_layers() < self.n_layers:
            fail("mix_fraction", self.mix_fraction, f"with placement=mix and n_layers={self.n_layers}, a fraction "
                 f"giving between 1 and {self.n_layers - 1} Post-LN layers (floor(fraction * n_layers), here "
                 f"{self.mix_post_layers()}); otherwise use placement=pre or post")
        if self.layers is not None:
            if len(self.layers) != self.n_layers:
                fail("layers", self.layers, f"one entry per layer (n_layers={self.n_layers})")
            for i, spec in enumerate(self.layers):
                if set(spec) - {"placement", "norm"}:
                    fail(f"layers[{i}]", spec, "the keys placement, norm")
                check_choice(f"model.layers[{i}].placement", spec.get("placement", "pre"), tuple(LAYER_PLACEMENTS))
                check_choice(f"model.layers[{i}].norm", spec.get("norm", self.norm), sorted(NORMS))
        if self.layernorm_scaling and not any(LAYER_PLACEMENTS[p].scales_input for p, _ in self.layer_specs()):
            fail("layernorm_scaling", self.layernorm_scaling, "false when no layer has an input norm (it scales the "
                 "norm before each sublayer: placement pre, peri, or mix's Pre-LN layers)")
        self._check_ngpt()
        self.head_dim = self.dim // self.n_heads
        if self.ffn_hidden is None:
            self.ffn_hidden = self.multiple_of * math.ceil(8 * self.dim / 3 / self.multiple_of)

    def _check_qk_norm(self) -> None:
        """The QK-norm options that do not combine (Henry's L2 form is per head, has no gains, and sets the scale)."""
        if self.qk_norm == "l2":
            for name, default in (("qk_norm_axis", "head"), ("qk_norm_gains", None), ("attn_scale", None)):
                if getattr(self, name) != default:
                    raise invalid(f"model.{name}", getattr(self, name), f"{default!r} with qk_norm=l2 (Henry et al.: "
                                  "per-head L2 norms, no gains, a learned temperature as the scale)")
        if self.qk_norm_axis == "flat" and self.qk_norm_gains == "shared":
            raise invalid("model.qk_norm_gains", "shared", "per_head or null with qk_norm_axis=flat (the flattened "
                          "norm has one gain per head and feature)")

    def _check_ngpt(self) -> None:
        """nGPT replaces norms, placements and the attention's scale: the fields that would add to it keep their
        defaults (norm: none)."""
        if not self.ngpt:
            return
        defaults = ModelConfig.__dataclass_fields__
        for name in ("norm", "placement", "layers", "layernorm_scaling", "qk_norm", "v_norm", "attn_scale",
                     "embed_scale", "embed_norm", "final_norm", "branch_scale", "layer_output_scale", "n_kv_heads",
                     "attn_logit_softcap", "final_logit_softcap", "qkv_bias", "tie_embeddings"):
            want = "none" if name == "norm" else self.n_heads if name == "n_kv_heads" else defaults[name].default
            if getattr(self, name) != want:
                raise invalid(f"model.{name}", getattr(self, name), f"{want!r} with model.ngpt=true (nGPT "
                              "normalizes by the unit sphere itself)")

    def mix_post_layers(self) -> int:
        """Number of leading Post-LN layers of placement="mix" (Mix-LN: floor(alpha * L))."""
        return math.floor(self.mix_fraction * self.n_layers + 1e-9)

    def layer_specs(self) -> list[tuple[str, str]]:
        """(placement, norm) of each layer: 'mix' resolved per layer, then the per-layer overrides."""
        def placement(i: int) -> str:
            if self.placement == "mix":
                return "post" if i < self.mix_post_layers() else "pre"
            return self.placement

        specs = self.layers if self.layers is not None else [{}] * self.n_layers
        return [(s.get("placement", placement(i)), s.get("norm", self.norm)) for i, s in enumerate(specs)]

    def to_dict(self) -> dict:
        return asdict(self)


def make_norm(cfg: ModelConfig, name: str, dim: int | None = None, options: dict | None = None,
              attn: bool = False) -> nn.Module:
    """The one place the model builds a norm (batch-statistics norms get max_seq_len).

    ``options`` when given (the QK-norm's ``qk_norm_options``); else ``norm_options``, with
    ``attn_norm_options`` over them for the attention sublayer's norm (``attn``). Both are for ``cfg.norm``:
    a per-layer override with another norm gets only the options it also takes (e.g. zero_centered,
    eps_mode). An option a norm does not take is an error naming the field.
    """
    field_name = "model.qk_norm_options" if options is not None else "model.norm_options"
    if options is None:
        site = dict(cfg.attn_norm_options) if attn else {}
        options = {**cfg.norm_options, **site}
        if name != cfg.norm:
            options = {k: v for k, v in options.items() if k in norm_options(name)}
        field_name = "model.attn_norm_options" if site else field_name
    options = dict(options)
    if getattr(NORMS[name], "uses_positions", False):
        options.setdefault("max_seq_len", cfg.max_seq_len)
    try:
        return build_norm(name, dim or cfg.dim, cfg.norm_eps, impl=cfg.norm_impl, **options)
    except ConfigError as err:
        raise ConfigError(f"{field_name} ({name}): {err}") from None


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
        self.softcap, self.scale = cfg.attn_logit_softcap, cfg.attn_scale
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


class Block(nn.Module):
    """One decoder layer: for each sublayer f (attention, then feed-forward), its placement's rule combines the
    residual stream, f and the norms (minillm.placements: pre x + f(norm(x)), post norm(x + f(x)), peri, branch,
    deepnorm, double). With cfg.layernorm_scaling, the input norm of a placement that has one (pre, peri, double) is
    multiplied by 1 / sqrt(index + 1). With cfg.branch_scale, a learnable gain (``attn_gain``, ``ffn_gain``)
    multiplies what each branch ends in (the placement's ``branch_end``); with cfg.layer_output_scale, a learnable
    scalar (``out_scale``, init 1) the block's output. A pre block with norm=fused_rmsnorm and no branch gains adds
    the attention output and normalizes the sum for the feed-forward in one kernel.
    """

    def __init__(self, cfg: ModelConfig, placement: str, norm: str, index: int = 0):
        super().__init__()
        try:
            self.kind = get_placement(placement)
        except ValueError as err:
            raise ConfigError(f"block {err}") from None
        self.placement = placement
        # LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in LLMs"): the input norm's output of layer
        # l = index + 1 times 1/sqrt(l), so deep Pre-LN layers add less to the residual stream at init
        scaled = cfg.layernorm_scaling and self.kind.scales_input
        self.norm_scale = 1.0 / math.sqrt(index + 1) if scaled else 1.0
        self.alpha = self.kind.residual_scale(cfg)
        self.attn = Attention(cfg)
        self.ffn = FeedForward(cfg.dim, cfg.ffn_hidden, cfg.ngpt)
        # nGPT: h <- unit(h + |alpha| (unit(f(h)) - h)) after each sublayer, no norms (minillm.ngpt)
        self.attn_step, self.ffn_step = (NormalizedResidual(cfg.dim) if cfg.ngpt else None for _ in range(2))
        ffn_norm = make_norm(cfg, norm)  # first: an error in norm_options names that field, not attn_norm_options
        self.attn_norm, self.ffn_norm = make_norm(cfg, norm, attn=True), ffn_norm  # registered in this order
        self.attn_out_norm = make_norm(cfg, norm) if self.kind.out_norm else None
        self.ffn_out_norm = make_norm(cfg, norm) if self.kind.out_norm else None
        gains = cfg.branch_scale != "none"
        self.attn_gain, self.ffn_gain = (ResidualGain(cfg.branch_scale, cfg.dim, cfg.branch_scale_init, cfg.n_layers)
                                         if gains else None for _ in range(2))
        self.out_scale = nn.Parameter(torch.ones(1)) if cfg.layer_output_scale else None
        self.fused_add = self.kind.fused_add and hasattr(ffn_norm, "add_forward") and not gains

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None = None) -> Tensor:
        x = self.sublayers(x, cos, sin, cache)
        return x if self.out_scale is None else x * self.out_scale.to(x.dtype)

    def sublayers(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None = None) -> Tensor:
        if self.attn_step is not None:  # nGPT
            x = self.attn_step(x, self.attn(x, cos, sin, cache=cache))
            return self.ffn_step(x, self.ffn(x))
        if self.fused_add:  # y = ffn_norm(x + attention output), and that sum, from one kernel
            y, x = self.ffn_norm.add_forward(self.attn(self.attn_norm(x) * self.norm_scale, cos, sin, cache=cache), x)
            return x + self.ffn(y * self.norm_scale)
        start = cache.length if cache is not None else 0  # absolute position of x[:, 0]
        sublayers = ((lambda h: self.attn(h, cos, sin, cache=cache), self.attn_norm, self.attn_out_norm,
                      self.attn_gain), (self.ffn, self.ffn_norm, self.ffn_out_norm, self.ffn_gain))
        for f, norm, out_norm, gain in sublayers:
            norm, out_norm = at_positions(norm, start), at_positions(out_norm, start)
            if gain is not None:  # the gain multiplies what the branch ends in
                end = self.kind.branch_end
                f, norm, out_norm = (gain.wrap(f) if end == "f" else f, gain.wrap(norm) if end == "norm" else norm,
                                     gain.wrap(out_norm) if end == "out" else out_norm)
            x = self.kind.rule(x, f, norm, out_norm, self.norm_scale, self.alpha)
        return x


class Transformer(nn.Module):
    """Token embedding (times ``emb_scale`` with model.embed_scale, then ``emb_norm`` with model.embed_norm), blocks,
    final norm (model.final_norm; by default when the last block does not end in one), LM head (its logits
    soft-capped with ``final_logit_softcap``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.emb_scale = nn.Parameter(torch.empty(1)) if cfg.embed_scale else None
        self.emb_norm = make_norm(cfg, cfg.norm) if cfg.embed_norm else nn.Identity()
        self.layers = nn.ModuleList(Block(cfg, p, n, i) for i, (p, n) in enumerate(cfg.layer_specs()))
        last_placement, last_norm = cfg.layer_specs()[-1]
        final = cfg.final_norm if cfg.final_norm is not None else not LAYER_PLACEMENTS[last_placement].ends_normed
        self.norm = make_norm(cfg, last_norm) if final and not cfg.ngpt else nn.Identity()
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.logit_scale = Scaled(cfg.vocab_size, 1.0, cfg.dim**-0.5) if cfg.ngpt else None  # nGPT's s_z
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """All initialization lives here; ``cfg.init`` names the scheme (``auto``: each layer's placement's scheme,
        minillm.placements: deepnet for DeepNorm layers, gpt2 for the others, minillm's default):

        - gpt2 (GPT-2, nanoGPT): embeddings and linears N(0, init_std); the residual output projections
          (attn.wo, ffn.w2) N(0, init_std / sqrt(2 * n_layers)), or N(0, init_std) with depth_scaled_init=False
        - xavier (the original Transformer, the setting of Xiong et al. 2020): linears Xavier-normal
          (variance 2 / (fan_in + fan_out)), embeddings N(0, 1) (unit-scale inputs, as the paper's sqrt(d)
          scaling of N(0, 1/d) embeddings gives)
        - small (SmallInit of Nguyen & Salazar 2019, as GPT-NeoX implements it): embeddings and linears
          N(0, sqrt(2 / (5 * dim)))
        - deepnet (Wang et al. 2022): block linears Xavier-normal, with gain beta = (8L)^(-1/4) for wv, wo, w1,
          w2, w3 and gain 1 for wq, wk; embeddings and the head as gpt2
        - norms: their own reset_parameters() (gain 1 or 0 when zero-centered, bias 0, running stats reset)
        - scalars: emb_scale sqrt(dim) (DyT's LLM recipe), residual branch gains their ResidualGain init, each
          layer's out_scale 1
        - ngpt: every matrix N(0, 1 / sqrt(dim)), then on the unit sphere (minillm.ngpt.normalize_), the scales at
          their Scaled init
        """
        cfg = self.cfg
        for module in self.modules():  # first N(0, init_std) everywhere, in module order (the gpt2 draws)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=cfg.init_std)
                if getattr(module, "bias", None) is not None:  # qkv_bias
                    nn.init.zeros_(module.bias)
            elif module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        if self.emb_scale is not None:
            self.emb_scale.fill_(math.sqrt(cfg.dim))
        for block in self.layers:
            if block.out_scale is not None:
                block.out_scale.fill_(1.0)
        if cfg.init in ("xavier", "small"):
            self._reinit(self.tok_emb, cfg.init)
            if not cfg.tie_embeddings:
                self._reinit(self.lm_head, cfg.init)
        if cfg.ngpt:
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, mean=0.0, std=cfg.dim**-0.5)
            self.renormalize_()
            return
        beta = (8 * cfg.n_layers) ** -0.25
        depth_std = cfg.init_std / math.sqrt(2 * cfg.n_layers) if cfg.depth_scaled_init else cfg.init_std
        for block in self.layers:
            scheme = cfg.init if cfg.init != "auto" else block.kind.init
            if scheme == "gpt2":
                for w in (block.attn.wo, block.ffn.w2):
                    nn.init.normal_(w.weight, mean=0.0, std=depth_std)
            elif scheme == "deepnet":
                for w in (block.attn.wq, block.attn.wk):
                    nn.init.xavier_normal_(w.weight, gain=1.0)
                for w in (block.attn.wv, block.attn.wo, block.ffn.w1, block.ffn.w2, block.ffn.w3):
                    nn.init.xavier_normal_(w.weight, gain=beta)
            else:
                for w in block.modules():
                    if isinstance(w, nn.Linear):
                        self._reinit(w, scheme)

    def head_weight(self) -> Tensor:
        """The LM head's (V, C) weight as the logits see it: times nGPT's per-token scale s_z with model.ngpt."""
        w = self.lm_head.weight
        return w if self.logit_scale is None else w * self.logit_scale()[:, None].to(w.dtype)

    def renormalize_(self) -> None:
        """After an optimizer step: nGPT's matrices back on the unit sphere (minillm.ngpt.normalize_); else nothing."""
        if self.cfg.ngpt:
            normalize_(self)

    def _reinit(self, module: nn.Module, scheme: str) -> None:
        """One weight matrix (Linear or Embedding) of the xavier or small scheme (see init_weights)."""
        if scheme == "small":
            nn.init.normal_(module.weight, mean=0.0, std=math.sqrt(2 / (5 * self.cfg.dim)))
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=1.0)
        else:
            nn.init.xavier_normal_(module.weight, gain=1.0)

    def hidden(self, idx: Tensor, cache: list[KVCache] | None = None) -> Tensor:
        """Token ids (B, T) -> the last hidden states (B, T, C), after the final norm: what the LM head reads (a
        loss that never makes the whole batch's logits starts here: minillm.loss)."""
        B, T = idx.shape
        start = cache[0].length if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {start + T} exceeds model.max_seq_len={self.cfg.max_seq_len}")
        if cache is not None and self.training:
            raise RuntimeError("a KV-cached forward is for generation: call model.eval() first")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.emb_scale is not None:
            x = x * self.emb_scale.to(x.dtype)
        x = at_positions(self.emb_norm, start)(x)
        cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]  # (T, D/2)
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, cache=cache[i] if cache is not None else None)
        return at_positions(self.norm, start)(x)

    def forward(self, idx: Tensor, cache: list[KVCache] | None = None) -> Tensor:
        """Token ids (B, T) -> logits (B, T, vocab_size); with a cache (eval mode), idx continues its positions."""
        logits = self.lm_head(self.hidden(idx, cache))  # (B, T, V)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale().to(logits.dtype)
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else soft_cap(logits, cap)

    def new_cache(self) -> list[KVCache]:
        """An empty KV cache, one KVCache per layer."""
        return [KVCache(self.cfg.max_seq_len) for _ in self.layers]

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.tok_emb.weight.numel() if non_embedding and not self.cfg.tie_embeddings else n

    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, use_cache: bool = True) -> Tensor:
        """Continue idx (B, T) by max_new_tokens sampled tokens (minillm.generation.generate)."""
        return generate(self, idx, max_new_tokens, temperature, top_k, generator, use_cache)
