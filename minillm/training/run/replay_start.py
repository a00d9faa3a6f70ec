"""A replay's start: a checkpoint resumed as a new run (``ReplayStart``, a ``resume.Resume``) whose model and training
settings may differ from the checkpoint's only where the replay's overrides say, and the checkpoint as that run loads
it (``carry_over``): the weights and optimizer state carried over by parameter name where they apply, a parameter
the checkpoint lacks at its init, the lr scaled, and the states of the callbacks that describe the original run
(RunSummary, RunTotals) left out (resume.as_new_run), so the replay's summary covers the replay.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from minillm.errors import CheckpointError
from minillm.model import ModelConfig, Transformer
from minillm.training.checkpointing import config_diff, flatten, model_config_diff
from minillm.training.optim import param_groups, schedule_settings
from minillm.training.run.resume import Resume, as_new_run

# the replay overrides: what each may change in the model config, and in the run settings (checkpointed)
MODEL_OVERRIDES = {"norm": ("norm", "norm_eps", "norm_options", "attn_norm_options"), "placement": ("placement",),
                   "model.qk_norm": ("qk_norm",), "model.attn_logit_softcap": ("attn_logit_softcap",),
                   "model.final_logit_softcap": ("final_logit_softcap",)}
SETTING_OVERRIDES = {"trainer.precision": "trainer.precision", "optimizer.lr": "optimizer.lr",
                     "trainer.gradient_clip_val": "trainer.gradient_clip_val", "module.z_loss": "module.z_loss"}
OVERRIDES = (*MODEL_OVERRIDES, *SETTING_OVERRIDES)


@dataclass
class ReplayStart(Resume):
    """A checkpoint a replay starts from: a new run (its own folder, summary and W&B run) that keeps the
    checkpoint's model and settings except the ``overridden`` keys (of OVERRIDES)."""

    overridden: Collection[str] = field(default_factory=tuple)

    @property
    def continues_run(self) -> bool:
        return False

    @property
    def source(self) -> str:
        return f"the checkpoint {self.ckpt_path}"

    @property
    def saved_model(self) -> dict:
        return (self.header.get("hyper_parameters") or {}).get("model") or {}

    @property
    def saved_settings(self) -> dict:
        return (self.header.get("hyper_parameters") or {}).get("run_settings") or {}

    def check_model(self, model: dict) -> None:
        allowed = {f for key in self.overridden for f in MODEL_OVERRIDES.get(key, ())}
        diffs = [d for d in model_config_diff(self.saved_model, model) if d.split(":")[0] not in allowed]
        if diffs:
            raise CheckpointError(f"the run's command now composes another model than {self.source} holds "
                                  f"({'; '.join(diffs)}); a replay changes the model only by its overrides "
                                  f"({', '.join(MODEL_OVERRIDES)})")

    def check_settings(self, settings: dict) -> None:
        allowed = {SETTING_OVERRIDES[key] for key in self.overridden if key in SETTING_OVERRIDES}
        saved = {**self.saved_settings, "scheduler": schedule_settings(self.saved_settings.get("scheduler"))}
        diffs = [d for d in config_diff(flatten(saved), flatten(settings)) if d.split(":")[0] not in allowed]
        if diffs:
            raise CheckpointError(f"the run's command now composes other training settings than {self.source} "
                                  f"holds ({'; '.join(diffs)}); a replay changes them only by its overrides "
                                  f"({', '.join(SETTING_OVERRIDES)})")


def carry_over(ckpt: dict[str, Any], module: torch.nn.Module, keep_callbacks: Collection[str],
               lr_factor: float = 1.0) -> dict[str, Any]:
    """Make ``ckpt`` (a Lightning checkpoint, changed in place) loadable into ``module`` (a LitLM): returns what was
    carried over, initialized and dropped. The model's state by name, where the shapes agree (else the module's
    own init); the optimizer's state remapped by parameter name (a new parameter starts with none); every lr times
    lr_factor (the optimizer's groups and the schedule's base lrs); the callbacks' states only for keep_callbacks."""
    new_sd = module.state_dict()
    old_sd = ckpt["state_dict"]
    carried = [k for k, v in new_sd.items() if k in old_sd and tuple(old_sd[k].shape) == tuple(v.shape)]
    initialized = [k for k in new_sd if k not in carried]
    dropped = [k for k in old_sd if k not in new_sd or k in initialized]
    ckpt["state_dict"] = {k: old_sd[k] if k in carried else v.detach().clone() for k, v in new_sd.items()}
    saved_model = (ckpt.get("hyper_parameters") or {}).get("model") or {}
    if initialized or dropped:
        ckpt["optimizer_states"] = [_remap_optimizer(ckpt["optimizer_states"][0], ckpt.get("hyper_parameters") or {},
                                                     saved_model, module)]
    if lr_factor != 1.0:
        for group in ckpt["optimizer_states"][0]["param_groups"]:
            for key in ("lr", "initial_lr"):
                if key in group:
                    group[key] = group[key] * lr_factor
        for sched in ckpt.get("lr_schedulers") or []:
            for key in ("base_lrs", "_last_lr"):
                if key in sched:
                    sched[key] = [v * lr_factor for v in sched[key]]
    ckpt["callbacks"] = {k: v for k, v in as_new_run(ckpt).get("callbacks", {}).items() if k in keep_callbacks}
    ckpt.setdefault("hyper_parameters", {})["model"] = dict(module.hparams["model"])
    return {"carried": len(carried), "initialized": [k.removeprefix("model.") for k in initialized],
            "dropped": [k.removeprefix("model.") for k in dropped]}


def _remap_optimizer(state: dict, hparams: dict, saved_model: dict, module: torch.nn.Module) -> dict:
    """The optimizer state of the checkpoint's model as the state of ``module``'s parameter groups, by parameter
    name: a parameter of the same name and shape keeps its state, a new one starts without (as at a fresh start)."""
    with torch.device("meta"):  # the checkpoint's model, without memory: only its parameter names and shapes
        old = Transformer(ModelConfig(**saved_model))
    names = {id(p): n for n, p in old.named_parameters()}
    saved_groups = state["param_groups"]
    split = any(g.get("use_muon") for g in saved_groups)  # Muon's hidden matrices came first, in a group of their own
    old_groups = param_groups(old, hparams.get("decay_norms", False), hparams.get("decay_embeddings", False),
                              split_hidden=split)
    old_order = [(names[id(p)], tuple(p.shape)) for g in old_groups for p in g["params"]]
    old_index = {name: (i, shape) for i, (name, shape) in enumerate(old_order)}
    model = module.model
    new_names = {id(p): n for n, p in model.named_parameters()}
    groups, out_state, index = [], {}, 0
    if len(saved_groups) != len(module.param_groups()):
        raise CheckpointError("the checkpoint's optimizer has another number of parameter groups; a replay that "
                              "changes the model needs the optimizer=adamw kind of groups (decay, no decay)")
    for saved_group, group in zip(saved_groups, module.param_groups(), strict=True):
        ids = []
        for p in group["params"]:
            name = new_names[id(p)]
            found = old_index.get(name)
            if found is not None and found[1] == tuple(p.shape) and found[0] in state["state"]:
                out_state[index] = state["state"][found[0]]
            ids.append(index)
            index += 1
        groups.append({**saved_group, "params": ids})
    return {"state": out_state, "param_groups": groups}
