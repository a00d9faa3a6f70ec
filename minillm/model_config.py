"""The model's settings (ModelConfig: dims, the norm and its placement, QK-norm, residual scalars, init, muP, nGPT),
each checked when built, and the one place the model builds a norm (make_norm)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from torch import nn

from minillm import mup
from minillm.errors import ConfigError, check_bool, check_choice, check_int, check_number, invalid
from minillm.norms import IMPLS, NORMS, build_norm, norm_options
from minillm.norms.qk import QK_AXES, QK_GAINS, QK_NORMS, QK_SITES
from minillm.placements import BRANCH_SCALES
from minillm.placements import PLACEMENTS as LAYER_PLACEMENTS

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
        mup.check_config(self)
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
