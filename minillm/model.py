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

from minillm import mup
from minillm.errors import ConfigError, check_bool, check_choice, check_int, check_number, invalid
from minillm.generation import KVCache, generate
from minillm.norms import IMPLS, NORMS, build_norm, norm_options
from minillm.placements import PLACEMENTS as LAYER_PLACEMENTS
from minillm.placements import get as get_placement

BLOCK_PLACEMENTS = tuple(LAYER_PLACEMENTS)  # what one layer can be (minillm.placements)
PLACEMENTS = (*BLOCK_PLACEMENTS, "mix")  # mix: post in the first layers, pre after
QK_NORMS = ("none", "rmsnorm", "layernorm")
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
    qk_norm: str = "none"  # norm applied per head to queries and keys, before RoPE
    qk_norm_options: dict = field(default_factory=dict)  # options of the QK-norm (the main norm's are its own)
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
    parametrization: str = "standard"  # standard | mup (minillm.mup: init, attention scale, readout, lrs by width)
    mup_base_width: int | None = None  # parametrization=mup: the width at which muP and standard are the same model

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
        for name in ("tie_embeddings", "depth_scaled_init", "layernorm_scaling", "qkv_bias"):
            check_bool(f"model.{name}", getattr(self, name))
        for name in ("norm_options", "attn_norm_options", "qk_norm_options"):
            if not isinstance(getattr(self, name), Mapping):
                fail(name, getattr(self, name), "a mapping of a norm's options, e.g. {eps_mode: outside}")
        check_choice("model.norm", self.norm, sorted(NORMS))
        check_choice("model.norm_impl", self.norm_impl, IMPLS)
        check_choice("model.placement", self.placement, (*LAYER_PLACEMENTS, "mix"))  # the registry as it is now
        check_choice("model.qk_norm", self.qk_norm, QK_NORMS)
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
        self.head_dim = self.dim // self.n_heads
        mup.check_config(self)
        if self.ffn_hidden is None:
            self.ffn_hidden = self.multiple_of * math.ceil(8 * self.dim / 3 / self.multiple_of)

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
    """Causal self-attention with grouped-query heads, optional QK-norm and RoPE; with ``attn_logit_softcap`` the
    scores q.k / sqrt(D) are soft-capped before the softmax (computed explicitly, in fp32: SDPA has no soft-cap)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.softcap = cfg.attn_logit_softcap
        self.scale = mup.attention_scale(cfg)  # None: 1/sqrt(head_dim)
        qk = cfg.qk_norm != "none"
        self.q_norm = make_norm(cfg, cfg.qk_norm, cfg.head_dim, cfg.qk_norm_options) if qk else nn.Identity()
        self.k_norm = make_norm(cfg, cfg.qk_norm, cfg.head_dim, cfg.qk_norm_options) if qk else nn.Identity()

    def qk(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Queries (B, H, T, D) and keys (B, Hkv, T, D) as attention sees them (also used by probes)."""
        B, T, _ = x.shape
        q = self.q_norm(self.wq(x).view(B, T, self.n_heads, self.head_dim))  # (B, T, H, D)
        k = self.k_norm(self.wk(x).view(B, T, self.n_kv_heads, self.head_dim))  # (B, T, Hkv, D)
        return apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None = None) -> Tensor:
        B, T, C = x.shape
        q, k = self.qk(x, cos, sin)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
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
        """softmax(softcap(q k^T / sqrt(D)) masked) v for q (B, H, T, D), k and v (B, Hkv, S, D), mask (T, S) of
        the allowed pairs or None (all); returns (B, H, T, D) in v's dtype."""
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, S, D)
        with torch.autocast(q.device.type, enabled=False):  # fp32 scores even under autocast, which would make bf16
            scores = q.float() @ k.float().transpose(-2, -1)  # q.k / sqrt(D), or times muP's scale
            scores = soft_cap(scores / math.sqrt(self.head_dim) if self.scale is None else scores * self.scale,
                              self.softcap)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))  # (B, H, T, S)
            return (scores.softmax(dim=-1) @ v.float()).to(v.dtype)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """One decoder layer: for each sublayer f (attention, then feed-forward), its placement's rule combines the
    residual stream, f and the norms (minillm.placements: pre x + f(norm(x)), post norm(x + f(x)), peri, branch,
    deepnorm). With cfg.layernorm_scaling, the input norm of a placement that has one (pre, peri) is multiplied by
    1 / sqrt(index + 1). A pre block with norm=fused_rmsnorm adds the attention output and normalizes the sum for
    the feed-forward in one kernel.
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
        self.ffn = FeedForward(cfg.dim, cfg.ffn_hidden)
        ffn_norm = make_norm(cfg, norm)  # first: an error in norm_options names that field, not attn_norm_options
        self.attn_norm, self.ffn_norm = make_norm(cfg, norm, attn=True), ffn_norm  # registered in this order
        self.attn_out_norm = make_norm(cfg, norm) if self.kind.out_norm else None
        self.ffn_out_norm = make_norm(cfg, norm) if self.kind.out_norm else None
        self.fused_add = self.kind.fused_add and hasattr(ffn_norm, "add_forward")

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None = None) -> Tensor:
        if self.fused_add:  # y = ffn_norm(x + attention output), and that sum, from one kernel
            y, x = self.ffn_norm.add_forward(self.attn(self.attn_norm(x) * self.norm_scale, cos, sin, cache=cache), x)
            return x + self.ffn(y * self.norm_scale)
        start = cache.length if cache is not None else 0  # absolute position of x[:, 0]
        sublayers = ((lambda h: self.attn(h, cos, sin, cache=cache), self.attn_norm, self.attn_out_norm),
                     (self.ffn, self.ffn_norm, self.ffn_out_norm))
        for f, norm, out_norm in sublayers:
            x = self.kind.rule(x, f, at_positions(norm, start), at_positions(out_norm, start), self.norm_scale,
                               self.alpha)
        return x


class Transformer(nn.Module):
    """Token embedding, blocks, final norm (when the last block does not end in one), LM head (its logits
    soft-capped with ``final_logit_softcap``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, p, n, i) for i, (p, n) in enumerate(cfg.layer_specs()))
        last_placement, last_norm = cfg.layer_specs()[-1]
        ends_normed = LAYER_PLACEMENTS[last_placement].ends_normed
        self.norm = nn.Identity() if ends_normed else make_norm(cfg, last_norm)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
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
        - parametrization=mup: then the hidden matrices scaled by width (minillm.mup, docs/mup.md)
        """
        cfg = self.cfg
        for module in self.modules():  # first N(0, init_std) everywhere, in module order (the gpt2 draws)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=cfg.init_std)
                if getattr(module, "bias", None) is not None:  # qkv_bias
                    nn.init.zeros_(module.bias)
            elif module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        if cfg.init in ("xavier", "small"):
            self._reinit(self.tok_emb, cfg.init)
            if not cfg.tie_embeddings:
                self._reinit(self.lm_head, cfg.init)
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
        mup.scale_init(self)  # muP: the hidden matrices' std / sqrt(dim / mup_base_width)

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
        loss that never makes the whole batch's logits starts here: minillm.training.loss)."""
        B, T = idx.shape
        start = cache[0].length if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {start + T} exceeds model.max_seq_len={self.cfg.max_seq_len}")
        if cache is not None and self.training:
            raise RuntimeError("a KV-cached forward is for generation: call model.eval() first")
        x = self.tok_emb(idx)  # (B, T, C)
        cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]  # (T, D/2)
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, cache=cache[i] if cache is not None else None)
        x = at_positions(self.norm, start)(x)
        return x if self.cfg.parametrization == "standard" else x * mup.readout_mult(self.cfg)  # muP: 1 / m

    def forward(self, idx: Tensor, cache: list[KVCache] | None = None) -> Tensor:
        """Token ids (B, T) -> logits (B, T, vocab_size); with a cache (eval mode), idx continues its positions."""
        logits = self.lm_head(self.hidden(idx, cache))  # (B, T, V)
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
