"""muP, the maximal-update parametrization (Yang et al. 2022, "Tensor Programs V"), as ``model.parametrization=mup``:
the rules that make a model of width ``dim`` behave, step for step, like the model of width ``mup_base_width``
scaled up, so that an lr tuned at the base width carries over (docs/mup.md).

With the width multiplier m = dim / mup_base_width, relative to the standard model at the base width (where muP
and standard are the same model, weight for weight):

- hidden matrices (the attention and feed-forward linears: every 2-D parameter but the embedding and the head):
  init std divided by sqrt(m); AdamW lr divided by m and its weight decay multiplied by m (lr * decay, the
  decoupled decay per step, stays as at the base width); Muon's lr unchanged (its orthogonalized update already
  has the spectral size muP asks of a square hidden matrix; ``adjust_lr_fn=match_rms_adamw`` does not, see below)
- the head (readout): init and lr as at the base width, its input multiplied by 1 / m (the output multiplier)
- the embedding, norm gains, biases (vector-like parameters): init and lr as at the base width
- attention: scores q.k * sqrt(d0) / d, with d the head dim and d0 = mup_base_width / n_heads the head dim at the
  base width (1/d, equal to standard's 1/sqrt(d) at the base width; the heads are held fixed as width grows)

These are the rules of the ``mup`` package (MuReadout, MuAdamW, mup.init.normal_ on a constant-std init) for
minillm's own modules; tests/test_mup.py checks them against that package where it is installed. The rules
live here; model.py reads the attention scale, the readout multiplier and the init scale, minillm.training.optim and
the LightningModule the lr multipliers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from minillm.errors import ConfigError, check_choice, check_int, invalid
from minillm.placements import PLACEMENTS

if TYPE_CHECKING:  # model.py imports this module
    from minillm.model import ModelConfig

PARAMETRIZATIONS = ("standard", "mup")
MUON_ADJUST_LR = (None, "original")  # Muon's lr rules whose update size muP keeps at lr (see module docstring)


def check_config(cfg: ModelConfig) -> None:
    """model.parametrization and model.mup_base_width, and what muP cannot be combined with (one-line errors)."""
    check_choice("model.parametrization", cfg.parametrization, PARAMETRIZATIONS)
    if cfg.parametrization == "standard":
        if cfg.mup_base_width is not None:
            raise invalid("model.mup_base_width", cfg.mup_base_width, "null with parametrization=standard (it is "
                          "the base width of parametrization=mup)")
        return
    if cfg.mup_base_width is None:
        raise invalid("model.mup_base_width", None, "a width (an int >= 1, a multiple of n_heads) with "
                      "parametrization=mup: the width whose tuned lr carries over, e.g. model.mup_base_width=32")
    check_int("model.mup_base_width", cfg.mup_base_width, low=1)
    if cfg.mup_base_width % cfg.n_heads:
        raise invalid("model.mup_base_width", cfg.mup_base_width, f"a multiple of n_heads={cfg.n_heads}")
    if cfg.tie_embeddings:
        raise invalid("model.tie_embeddings", True, "false with parametrization=mup (the embedding and the head "
                      "are scaled differently)")
    if cfg.init not in ("auto", "gpt2"):
        raise invalid("model.init", cfg.init, "auto or gpt2 with parametrization=mup (muP rescales gpt2's "
                      "constant-std init by width; xavier, small and deepnet already depend on width)")
    deep = sorted({p for p, _ in cfg.layer_specs() if PLACEMENTS[p].init != "gpt2"})
    if cfg.init == "auto" and deep:
        raise invalid("model.placement", ",".join(deep), "a placement with the gpt2 init under parametrization=mup "
                      "(deepnorm's own init depends on width)")


def width_mult(cfg: ModelConfig) -> float:
    """m = dim / mup_base_width under muP; 1 in standard parametrization."""
    return cfg.dim / cfg.mup_base_width if cfg.parametrization == "mup" else 1.0


def attention_scale(cfg: ModelConfig) -> float | None:
    """The factor of the attention scores q.k: sqrt(d0) / d under muP; None in standard parametrization (SDPA's
    1/sqrt(d), computed as before)."""
    if cfg.parametrization != "mup":
        return None
    return math.sqrt(cfg.mup_base_width / cfg.n_heads) / cfg.head_dim


def readout_mult(cfg: ModelConfig) -> float:
    """The multiplier of the head's input: 1 / m (1 in standard parametrization and at the base width)."""
    return 1.0 / width_mult(cfg)


def is_hidden_matrix(name: str, p: nn.Parameter) -> bool:
    """A 2-D parameter other than the embedding and the head (a Transformer's named_parameters)."""
    return p.ndim == 2 and not name.startswith(("tok_emb.", "lm_head."))


def hidden_init_mult(cfg: ModelConfig) -> float:
    """The factor of the hidden matrices' init std: 1 / sqrt(m)."""
    return width_mult(cfg) ** -0.5


@torch.no_grad()
def scale_init(model: nn.Module) -> None:
    """Multiply a freshly initialized Transformer's hidden matrices by hidden_init_mult (nothing in standard
    parametrization, so its draws stay bit for bit)."""
    if model.cfg.parametrization != "mup":
        return
    for name, p in model.named_parameters():
        if is_hidden_matrix(name, p):
            p.mul_(hidden_init_mult(model.cfg))


def hidden_lr_mult(cfg: ModelConfig, optimizer: str = "adamw", adjust_lr_fn: str | None = None) -> float:
    """The factor of the hidden matrices' lr for ``optimizer`` (``adamw``: AdamW or Adam; ``muon``: Muon; anything
    else is refused under muP): 1 / m for AdamW (each entry of its update moves by about lr, so the update of a
    matrix grows with its fan-in), 1 for Muon with its original lr rule. Muon's ``match_rms_adamw`` (its update
    scaled to AdamW's entry size) is refused under muP: one rule per optimizer, each checked by the coordinate
    check."""
    if cfg.parametrization != "mup":
        return 1.0
    if optimizer == "adamw":
        return 1.0 / width_mult(cfg)
    if optimizer != "muon":
        raise ConfigError(f"optimizer {optimizer} has no muP lr rule (model.parametrization=mup); allowed: "
                          "optimizer=adamw (torch.optim.AdamW or Adam), optimizer=muon "
                          "(minillm.training.optim.MuonWithAdamW)")
    if adjust_lr_fn not in MUON_ADJUST_LR:
        raise invalid("optimizer.adjust_lr_fn", adjust_lr_fn, "null or original with model.parametrization=mup")
    return 1.0
