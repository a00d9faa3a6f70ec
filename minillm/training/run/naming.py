"""What a run is called: its W&B name (what differs from the default run, and a sweep job's own overrides) and
its W&B group (one per sweep)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from minillm.paths import sweep_group
from minillm.training.run.hydra import config_dir


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def group_sweeps(cfg: DictConfig) -> None:
    """In a Hydra multirun, make the W&B group name + the sweep's folder name: one group per sweep; name the
    W&B run by run_name unless the config names it."""
    wandb = (cfg.get("logger") or {}).get("wandb")
    if wandb is None:
        return
    with open_dict(cfg):
        if in_multirun():
            wandb.group = sweep_group(cfg.name, HydraConfig.get().sweep.dir)
        if not wandb.get("name"):
            wandb.name = run_name(cfg)


# model options a run's name shows (as <key> when true, else <key>=<value>) where they differ from the default run's
MODEL_TAGGED = ("qk_norm_axis", "qk_norm_on", "qk_norm_gains", "v_norm", "attn_scale", "branch_scale",
                "branch_scale_init", "layer_output_scale", "embed_scale", "embed_norm", "layernorm_scaling", "ngpt",
                "attn_logit_softcap", "final_logit_softcap")
NAMED = ("norm", "placement", "model.n_layers", "model.dim", "model.qk_norm", "model.parametrization",
         "model.mup_base_width", *(f"model.{k}" for k in MODEL_TAGGED), "optimizer", "optimizer._target_",
         "optimizer.lr", "optimizer.adamw_lr", "scheduler.warmup_steps", "trainer.precision",
         "seed")  # what run_name always shows (when not default)
UNNAMED = ("paths", "hydra", "logger", "callbacks", "name", "run_id", "ckpt_path", "tags", "experiment", "data.files",
           "train", "test", "threads", "decay_from",
           "print_config")  # overrides a sweep job's name leaves out: these keys and the ones under them


def unnamed(key: str) -> bool:
    """``key`` is one of UNNAMED or under one (``trainer.max_steps`` is not under ``train``)."""
    return any(key == u or key.startswith((u + ".", u + "/")) for u in UNNAMED)


@cache
def defaults() -> dict[str, Any]:
    """What the default run has (configs/model/default.yaml, scheduler/cosine.yaml, trainer/default.yaml): a
    run's name shows a setting only where it differs."""
    folder = Path(config_dir())
    model = OmegaConf.load(folder / "model" / "default.yaml")
    return {"n_layers": model.n_layers, "dim": model.dim, "qk_norm": model.qk_norm,
            "model": {k: model.get(k) for k in MODEL_TAGGED},
            "optimizer": OmegaConf.load(folder / "optimizer" / "adamw.yaml")._target_,
            "warmup_steps": OmegaConf.load(folder / "scheduler" / "cosine.yaml").warmup_steps,
            "precision": str(OmegaConf.load(folder / "trainer" / "default.yaml").precision)}


def run_name(cfg: DictConfig) -> str:
    """``<norm>-<placement>[-L<layers>][-d<dim>][-qk<qk_norm>][-<model options>][-mup<base width>][-<optimizer>]-lr<lr>
    [-alr<adamw lr>][-wu<warmup>][-<precision>]-s<seed>[-from<step>]`` (L, d, qk, the optimizer, wu and the precision
    where they differ from the default run's, ``defaults``; the model options of MODEL_TAGGED likewise, each as
    model_tag writes it; mup with model.parametrization=mup; alr with
    optimizer=muon; from<step> for a decay branch, decay_from), and in a sweep every other override of the job as
    ``-<last key part>=<value>``: the sweep's jobs get distinct names."""
    model, warmup, default = cfg.model, OmegaConf.select(cfg, "scheduler.warmup_steps"), defaults()
    parts = [str(model.norm), str(cfg.placement)]
    parts += [f"L{model.n_layers}"] if model.n_layers != default["n_layers"] else []
    parts += [f"d{model.dim}"] if model.dim != default["dim"] else []
    parts += [f"qk{model.qk_norm}"] if model.qk_norm != default["qk_norm"] else []
    parts += [model_tag(k, model.get(k)) for k in MODEL_TAGGED if model.get(k) != default["model"][k]]
    parts += [f"mup{model.mup_base_width}"] if model.get("parametrization") == "mup" else []
    target = str(cfg.optimizer.get("_target_", default["optimizer"]))
    parts += [optimizer_tag(target)] if target != default["optimizer"] else []
    parts += [f"lr{cfg.optimizer.lr:g}"] + ([f"alr{cfg.optimizer.adamw_lr:g}"] if "adamw_lr" in cfg.optimizer else [])
    parts += [f"wu{warmup}"] if warmup not in (None, default["warmup_steps"]) else []
    parts += [str(cfg.trainer.precision)] if str(cfg.trainer.precision) != default["precision"] else []
    parts += [f"s{cfg.seed}"]
    branch_step = OmegaConf.select(cfg, "scheduler.decay_start") if cfg.get("decay_from") else None
    parts += [f"from{branch_step}"] if branch_step is not None else []
    if in_multirun():
        for override in HydraConfig.get().overrides.task:
            key, _, value = override.lstrip("+~").partition("=")
            if key not in NAMED and not unnamed(key):
                parts.append(f"{key.rsplit('.', 1)[-1]}={value}")
    return "-".join(parts)


def model_tag(key: str, value: Any) -> str:
    """A model option in a run name: ``v_norm`` for true, else ``qk_norm_axis=flat``, ``attn_scale=0.2``."""
    return key if value is True else f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"


def optimizer_tag(target: str) -> str:
    """The optimizer in a run name: ``muon`` for MuonWithAdamW, else the class name in lower case."""
    name = target.rsplit(".", 1)[-1]
    return "muon" if name == "MuonWithAdamW" else name.lower()
