"""Resuming, decided in one pass before anything is built: which checkpoint (``ckpt_path``: a file, or ``auto``,
this run folder's newest), its header read once, and the checks that the run keeps the checkpoint's model and
training settings. Also what ``train=false`` (evaluate a checkpoint) changes in a run's record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from minillm.checkpointing import check_model_config, check_settings, find_resume_checkpoint, read_checkpoint_header
from minillm.errors import ConfigError
from minillm.optim import schedule_settings

log = logging.getLogger("minillm")
EVALUATION_FILE = "evaluation.json"  # what RunSummary writes for train=false (summary.json is a training's record)


@dataclass
class Resume:
    """The checkpoint a run starts from (None: a fresh run) and its header (read once, memory-mapped)."""

    ckpt_path: str | None = None
    header: dict[str, Any] = field(default_factory=dict)

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
        if self.ckpt_path:
            check_settings((self.header.get("hyper_parameters") or {}).get("run_settings"), settings, self.source)

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
        if auto:  # a run without checkpoints (trainer.enable_checkpointing=false), or one that crashed first
            raise ConfigError(f"ckpt_path=auto: the run directory {out_dir} holds a run (summary.json) but no "
                              "checkpoint to resume; give this run another run_id or name")
        raise ConfigError(f"the run directory {out_dir} already holds a run (summary.json); resume it with "
                          "ckpt_path=auto, or give this run another run_id or name")
    resume = Resume(str(ckpt), read_checkpoint_header(ckpt)) if ckpt is not None else Resume()
    if not training:
        as_evaluation(cfg)
    elif resume.ckpt_path:
        continue_wandb_run(cfg, resume.header)
    return resume


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
    validation cadence and max_steps (with a schedule that does not read it) may change."""
    c = OmegaConf.to_container(cfg, resolve=True)
    module = {k: v for k, v in (c.get("module") or {}).items() if not k.startswith(("_", "compile"))}
    data = {k: v for k, v in (c.get("data") or {}).items() if k not in ("_target_", "_convert_", "num_workers",
                                                                       "cache_dir", "sample_prompt")}
    trainer = c.get("trainer") or {}
    return {"seed": c.get("seed"), "optimizer": c.get("optimizer"), "scheduler": schedule_settings(c.get("scheduler")),
            "module": module, "data": data, "world_size": world_size,
            "trainer": {k: trainer.get(k) for k in ("precision", "gradient_clip_val", "gradient_clip_algorithm",
                                                    "accumulate_grad_batches")}}
