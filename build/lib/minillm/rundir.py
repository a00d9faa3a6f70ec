"""Run directories: unique for every start, stable for the restarts of one run (the Hydra resolvers).

    logs/<name>/runs/<run id>/            one run  (hydra.run.dir)
    logs/<name>/multiruns/<run id>/<job>/ one job of a sweep (hydra.sweep.dir / hydra.sweep.subdir)

The run id is ``run_id`` when set; under SLURM ``slurm-<job id>`` (``slurm-<array job>_<task>`` in an array),
which every rank of the job shares and a requeued job keeps; under torchrun with a rendezvous id
``torchrun-<id>``; else the start time and six random hex digits (``2026-11-23_14-05-09_3fa2c1``), so runs
started in the same second never share a folder. ``ckpt_path=<file>`` in ``<run>/checkpoints/`` continues in
``<run>``: one run, one folder, one summary. A resumed run's Hydra files go to ``.hydra/resumed-<time>/``.
"""

from __future__ import annotations

import os
import secrets
import time
from functools import cache
from pathlib import Path

from omegaconf import OmegaConf


@cache
def new_run_id() -> str:
    """This process's run id (computed once, so every resolution of the run dir agrees)."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}"
    if env.get("TORCHELASTIC_RUN_ID", "none") != "none":
        return f"torchrun-{env['TORCHELASTIC_RUN_ID']}"
    return f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{secrets.token_hex(3)}"


def run_id(given: str | None) -> str:
    return str(given) if given not in (None, "") else new_run_id()


def run_dir(base: str, given_id: str | None, ckpt_path: str | None) -> str:
    """``<base>/<run id>``, or the run folder of the checkpoint being resumed (``<run>/checkpoints/x.ckpt``)."""
    if ckpt_path not in (None, "", "auto"):
        ckpt = Path(str(ckpt_path)).expanduser()
        if ckpt.parent.name == "checkpoints":
            return str(ckpt.parent.parent)
    return f"{base}/{run_id(given_id)}"


@cache
def hydra_subdir(output_dir: str) -> str:
    """Where Hydra writes the composed config: ``.hydra``, or ``.hydra/resumed-<time>`` when the folder already
    holds a run's (a resumed run keeps the original command's files). Decided once per folder and process."""
    if (Path(output_dir) / ".hydra" / "config.yaml").exists():
        return f".hydra/resumed-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    return ".hydra"


def choices(kind: str) -> str:
    """The allowed values of a key with fixed choices, for --help (from the code that checks them)."""
    from minillm.lit_module import SCHEDULES
    from minillm.model import PLACEMENTS, QK_NORMS
    from minillm.train import PRECISIONS, TEST_WEIGHTS

    lists = {"placement": PLACEMENTS, "qk_norm": QK_NORMS, "schedule": SCHEDULES, "precision": PRECISIONS,
             "test_weights": TEST_WEIGHTS}
    return ", ".join(lists[kind])


def slurm_gpus(accelerator: str, devices: object) -> int:
    """GPUs per node for the slurm launcher presets: trainer.devices on a GPU trainer, else 0."""
    if accelerator not in ("gpu", "cuda"):
        return 0
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"hydra/launcher=slurm needs trainer.devices = the GPUs per node (an integer >= 1), got "
                         f"{devices!r}")
    return devices


def slurm_tasks(accelerator: str, devices: object) -> int:
    """Tasks per node: one per GPU (Lightning's SLURM environment), one on a CPU trainer."""
    return max(slurm_gpus(accelerator, devices), 1)


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("minillm.slurm_gpus", slurm_gpus, replace=True)
    OmegaConf.register_new_resolver("minillm.slurm_tasks", slurm_tasks, replace=True)
    OmegaConf.register_new_resolver("minillm.choices", choices, replace=True)
    OmegaConf.register_new_resolver("minillm.min", min, replace=True)
    # use_cache: the resolved value travels with the config to launcher processes (joblib, submitit)
    OmegaConf.register_new_resolver("minillm.run_id", run_id, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("minillm.run_dir", run_dir, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("minillm.hydra_subdir", hydra_subdir, replace=True)
