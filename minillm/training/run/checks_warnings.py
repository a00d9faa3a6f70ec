"""The settings a run accepts but that do nothing here, or that override one of minillm's rules: one warning line
each, at the start of the run (after the checks, before the data), so that a user who set them knows."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from minillm.analysis.runs import label
from minillm.model import ModelConfig
from minillm.training.optim import DECAY_SETTINGS

log = logging.getLogger("minillm")
DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING}
QK_NORM_FIELDS = ("qk_norm_axis", "qk_norm_on", "qk_norm_gains")  # what shapes a QK-norm (with qk_norm_options)
WSD_ONLY = tuple(k for k in DECAY_SETTINGS if k.startswith("decay_"))  # the schedule arguments only wsd reads


def _set(model: Mapping, key: str) -> bool:
    return key in model and model[key] != DEFAULTS.get(key)


def _idle(model: Mapping, scheduler: Mapping) -> list[str]:
    """Settings that do nothing with the rest of the config."""
    out = []
    if model.get("qk_norm", "none") == "none":
        for key in [k for k in QK_NORM_FIELDS if _set(model, k)] + (["qk_norm_options"] if model.get(
                "qk_norm_options") else []):
            out.append(f"model.{key}={label(model[key])} does nothing without a QK-norm (model.qk_norm=none); "
                       "set model.qk_norm=rmsnorm, layernorm or l2, or leave it out")
    if model.get("branch_scale_init") is not None and model.get("branch_scale", "none") == "none":
        out.append(f"model.branch_scale_init={label(model['branch_scale_init'])} does nothing with "
                   "model.branch_scale=none; set model.branch_scale=rezero or layerscale, or leave it out")
    kind = scheduler.get("kind")
    if kind is not None and kind != "wsd":
        for key in (k for k in WSD_ONLY if k in scheduler):
            out.append(f"scheduler.{key}={label(scheduler[key])} does nothing with scheduler.kind={kind} (only "
                       "scheduler=wsd reads it); use scheduler=wsd, or leave it out")
    return out


def _overrides(model: Mapping, optimizer: Mapping) -> list[str]:
    """Settings that replace one of minillm's rules (muP's, nGPT's)."""
    out = []
    mup, ngpt = model.get("parametrization") == "mup", bool(model.get("ngpt"))
    if mup and model.get("attn_scale") is not None:
        out.append(f"model.attn_scale={label(model['attn_scale'])} replaces muP's attention scale (sqrt(d0) / d, "
                   "minillm.mup): the scale no longer follows the width, so a tuned lr may not carry over")
    if mup and ngpt:
        out.append("model.ngpt=true with model.parametrization=mup: nGPT puts every matrix back on the unit sphere "
                   "after each step, which undoes muP's init by width (its readout and lr rules still apply)")
    decay = optimizer.get("weight_decay")
    if ngpt and isinstance(decay, (int, float)) and decay > 0:
        out.append(f"optimizer.weight_decay={label(decay)} with model.ngpt=true: nGPT trains without weight decay "
                   "(its matrices are renormalized after every step; experiment=ngpt sets 0); set "
                   "optimizer.weight_decay=0")
    base, dim = model.get("mup_base_width"), model.get("dim")
    if mup and isinstance(base, int) and isinstance(dim, int) and base > dim:
        out.append(f"model.mup_base_width={base} is above model.dim={dim}: muP then scales down from a wider base "
                   "(width multiplier < 1); the base is the width the lr was tuned at, usually the smallest")
    return out


def setting_warnings(c: Mapping[str, Any]) -> list[str]:
    """The warning lines of a resolved config (a plain dict)."""
    model, scheduler, optimizer = (c.get(k) or {} for k in ("model", "scheduler", "optimizer"))
    return _idle(model, scheduler) + _overrides(model, optimizer)


def warn_about_settings(cfg: DictConfig) -> None:
    for line in setting_warnings(OmegaConf.to_container(cfg, resolve=True)):
        log.warning(f"warning: {line}")
