"""Resuming, decided in one pass before anything is built: which checkpoint (``ckpt_path``: a file, or ``auto``,
this run folder's newest), its header read once, and the checks that the run keeps the checkpoint's model and
training settings. Also what ``train=false`` (evaluate a checkpoint) changes in a run's record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from minillm.errors import ConfigError
from minillm.training.checkpointing import (
    AtomicCheckpointIO,
    check_model_config,
    check_settings,
    find_resume_checkpoint,
    read_checkpoint_header,
)
from minillm.training.optim import decay_start, schedule_settings, stable_phase_settings

log = logging.getLogger("minillm")
EVALUATION_FILE = "evaluation.json"  # what RunSummary writes for train=false (summary.json is a training's record)
DESCRIBES_THE_RUN = ("RunSummary", "RunTotals")  # callbacks whose state is their run's record of itself


@dataclass
class Resume:
    """The checkpoint a run starts from (None: a fresh run) and its header (read once, memory-mapped)."""

    ckpt_path: str | None = None
    header: dict[str, Any] = field(default_factory=dict)
    branch: bool = False  # a decay branch starting from its parent's checkpoint: a new run, not this one resumed

    @property
    def continues_run(self) -> bool:
        """The run goes on in the checkpoint's own run (same folder, W&B run, CSV log)."""
        return bool(self.ckpt_path) and not self.branch

    @property
    def source(self) -> str:
        return f"ckpt_path={self.ckpt_path!r}"

    @property
    def step(self) -> int:
        return int(self.header.get("global_step", 0))

    def check_model(self, model: dict) -> None:
        """The checkpoint was written for this model config (fused_rmsnorm = rmsnorm)."""
        if self.ckpt_path:
            check_model_config((self.header.get("hyper_parameters") or {}).get("model"), model, self.source)

    def check_settings(self, settings: dict) -> None:
        """The run keeps the checkpoint's training settings (run_settings)."""
        if not self.ckpt_path:
            return
        saved = (self.header.get("hyper_parameters") or {}).get("run_settings")
        if self.branch and saved is not None:  # the one change a run may make: its schedule's decay
            saved = {**saved, "scheduler": stable_phase_settings(saved.get("scheduler"))}
            settings = {**settings, "scheduler": stable_phase_settings(settings.get("scheduler"))}
        check_settings(saved, settings, self.source)

    def state_of(self, name: str) -> dict:
        """The state a component stored in the checkpoint under its class name (e.g. the data module's)."""
        return self.header.get(name) or {}


def resolve(cfg: DictConfig) -> Resume:
    """ckpt_path as given (its header read: a missing or unreadable file is refused before the data is prepared),
    or for ckpt_path=auto the newest valid checkpoint of this run folder (none: the run starts fresh). A fresh run
    never writes into a folder that already holds a run. A resumed run continues its W&B run; an evaluation
    (train=false) gets a record of its own."""
    ckpt, out_dir, training = cfg.get("ckpt_path"), Path(cfg.paths.output_dir), cfg.get("train", True)
    auto = ckpt == "auto"
    if auto:
        found = find_resume_checkpoint(out_dir)
        log.info(f"ckpt_path=auto: {'resuming from ' + str(found) if found else 'no checkpoint in '}"
                 f"{'' if found else str(out_dir / 'checkpoints') + ', starting fresh'}")
        ckpt = str(found) if found else None
    if ckpt is None and training and (out_dir / "summary.json").exists():
        if auto:  # a run stopped without a checkpoint (a crashed one never gets here: train.py leaves it as it is)
            raise ConfigError(f"ckpt_path=auto: the run directory {out_dir} holds a run (summary.json) but no "
                              "checkpoint to resume; give this run another run_id or name")
        raise ConfigError(f"the run directory {out_dir} already holds a run (summary.json); resume it with "
                          "ckpt_path=auto, or give this run another run_id or name")
    parent = decay_branch(cfg) if cfg.get("decay_from") else None
    if ckpt is not None:
        resume = Resume(str(ckpt), read_checkpoint_header(ckpt))
    elif parent is not None:
        resume = Resume(parent["checkpoint"], parent.pop("header"), branch=True)
    else:
        resume = Resume()
    if parent is not None:
        parent.pop("header", None)
        record_parent(cfg, parent)
    if not training:
        model_as_trained(cfg, (resume.header.get("hyper_parameters") or {}).get("model"))
        as_evaluation(cfg)
    elif resume.continues_run:
        continue_wandb_run(cfg, resume.header)
    return resume


def decay_branch(cfg: DictConfig) -> dict[str, Any]:
    """decay_from=<checkpoint of a stable phase>: the branch decays from that checkpoint's step k for D steps, the
    decay_fraction of its whole run (D = fraction * k / (1 - fraction)), so it is the WSD run of k + D steps; sets
    scheduler.decay_start = k and trainer.max_steps = k + D. Returns the parent (run folder, checkpoint, step)."""
    path, scheduler = str(cfg.decay_from), cfg.get("scheduler") or {}
    if scheduler.get("kind") != "wsd":
        raise ConfigError(f"decay_from={path!r} starts a decay branch: it needs scheduler=wsd (the decay's shape and "
                          f"fraction), not scheduler.kind={scheduler.get('kind')!r}")
    fraction = scheduler.get("decay_fraction")
    if not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError(f"scheduler.decay_fraction={fraction!r} is invalid for a decay branch; allowed: a number "
                          "> 0 and < 1 (the share of the branch's whole run that decays)")
    if not Path(path).expanduser().is_file():
        what = "is a folder, not a checkpoint" if Path(path).expanduser().is_dir() else "does not exist"
        raise ConfigError(f"decay_from={path!r} {what}; allowed: a checkpoint file of a stable phase, e.g. "
                          "<run>/checkpoints/step-<k>.ckpt")
    header = read_checkpoint_header(path, field="decay_from")
    step = int(header.get("global_step", 0))
    saved = ((header.get("hyper_parameters") or {}).get("run_settings") or {}).get("scheduler") or {}
    if saved.get("kind") not in ("wsd", "constant"):
        raise ConfigError(f"decay_from={path!r} is a checkpoint of a scheduler.kind={saved.get('kind')!r} run; "
                          "allowed: a checkpoint of a wsd or constant run's stable phase")
    if saved.get("kind") == "wsd":
        start = decay_start(saved["total_steps"], saved.get("decay_fraction", 0.2), saved.get("decay_start"))
        if step > start:
            raise ConfigError(f"decay_from={path!r} is at step {step}, in its run's decay (from step {start}); "
                              f"allowed: a checkpoint of the stable phase (step <= {start})")
    length = max(1, round(fraction * step / (1 - fraction)))
    with open_dict(cfg):
        cfg.scheduler.decay_start = step
        cfg.trainer.max_steps = step + length
    ckpt = Path(path)
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    log.info(f"decay branch of {run} from step {step}: {scheduler.get('decay_shape')} decay over {length} steps "
             f"to step {step + length} (trainer.max_steps={step + length})")
    return {"run_dir": str(run), "checkpoint": path, "step": step, "header": header}


def record_parent(cfg: DictConfig, parent: dict[str, Any]) -> None:
    """summary.json of a decay branch names the run and checkpoint it branched from (``parent``)."""
    summary = (cfg.get("callbacks") or {}).get("summary")
    if summary is not None:
        with open_dict(cfg):
            summary.config = {**OmegaConf.to_container(summary.get("config") or {}, resolve=True), "parent": parent}


GROUP_FIELDS = {"norm": ("norm", "norm_eps", "norm_options"), "placement": ("placement",)}  # what a group sets


def model_as_trained(cfg: DictConfig, saved: dict | None) -> None:
    """train=false: the model config is the checkpoint's (no retyping of a non-default model), except the fields
    the command line sets (model.<field>=, norm=, placement=: e.g. norm=rmsnorm for a fused_rmsnorm checkpoint on
    the CPU), which the comparison with the checkpoint then checks."""
    if not isinstance(saved, dict):
        return
    given: set[str] = set()
    if HydraConfig.initialized():
        for override in HydraConfig.get().overrides.task:
            key = override.lstrip("+~").split("=", 1)[0]
            given |= set(GROUP_FIELDS.get(key, ())) | ({key.split(".")[1]} if key.startswith("model.") else set())
    with open_dict(cfg):
        for name, value in saved.items():
            if name in cfg.model and name not in given and name != "vocab_size":  # the tokenizer decides it
                cfg.model[name] = value
        if "placement" not in given and "placement" in saved:
            cfg.placement = saved["placement"]


def as_evaluation(cfg: DictConfig) -> None:
    """train=false: the run records an evaluation (its summary file, a W&B run of job_type eval), so a sweep
    report never counts it as a training run."""
    with open_dict(cfg):
        summary = (cfg.get("callbacks") or {}).get("summary")
        if summary is not None:
            summary.filename = EVALUATION_FILE
        wandb = (cfg.get("logger") or {}).get("wandb")
        if wandb is not None:
            wandb.job_type = "eval"


def continue_wandb_run(cfg: DictConfig, header: dict) -> None:
    """A resumed run continues the W&B run its checkpoint names (same id, resume="allow")."""
    run_id = (header.get("minillm") or {}).get("wandb_run_id")
    wandb = (cfg.get("logger") or {}).get("wandb")
    if run_id and wandb is not None:
        with open_dict(cfg):
            wandb.id, wandb.resume = run_id, "allow"


def run_settings(cfg: DictConfig, world_size: int) -> dict[str, Any]:
    """What a resumed run must keep (stored in checkpoints, compared on resume): seed, optimizer, schedule,
    the loss options, the data stream and the trainer settings that change the math. Logging, callbacks,
    validation cadence, where per-window losses go (module.eval_windows_dir: the run's own folder) and max_steps
    (with a schedule that does not read it) may change."""
    c = OmegaConf.to_container(cfg, resolve=True)
    module = {k: v for k, v in (c.get("module") or {}).items() if not k.startswith(("_", "compile", "eval_windows"))}
    data = {k: v for k, v in (c.get("data") or {}).items() if k not in ("_target_", "_convert_", "num_workers",
                                                                       "cache_dir", "sample_prompt")}
    trainer = c.get("trainer") or {}
    return {"seed": c.get("seed"), "optimizer": c.get("optimizer"), "scheduler": schedule_settings(c.get("scheduler")),
            "module": module, "data": data, "world_size": world_size,
            "trainer": {k: trainer.get(k) for k in ("precision", "gradient_clip_val", "gradient_clip_algorithm",
                                                    "accumulate_grad_batches")}}


def as_new_run(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint that a new run starts from (a decay branch, a replay), changed in place: without the states of
    the callbacks that record their run (DESCRIBES_THE_RUN), so the new run's summary covers its own steps (its
    validations, maxima, times and start), not its parent's."""
    ckpt["callbacks"] = {k: v for k, v in (ckpt.get("callbacks") or {}).items() if k not in DESCRIBES_THE_RUN}
    return ckpt


class TransformedCheckpointIO(AtomicCheckpointIO):
    """The checkpoint IO of a run that starts from another's checkpoint: a load passes it through ``transform``
    (as_new_run, or a replay's carry_over)."""

    def __init__(self, transform: Callable[[dict[str, Any]], dict[str, Any]]):
        super().__init__()
        self.transform = transform

    def load_checkpoint(self, path: Any, map_location: Any = lambda storage, loc: storage,
                        weights_only: bool | None = None) -> dict[str, Any]:
        return self.transform(super().load_checkpoint(path, map_location=map_location, weights_only=weights_only))
