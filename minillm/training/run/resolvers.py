"""The Hydra resolvers of minillm's configs: run folders (unique for every start, stable for the restarts of one
run), the SLURM sizes of the launcher presets, --help's lists of choices, and ``min``. Run folders:

    logs/<name>/runs/<run id>/            one run  (hydra.run.dir)
    logs/<name>/multiruns/<run id>/<job>/ one job of a sweep (hydra.sweep.dir / hydra.sweep.subdir)

The run id is ``run_id`` when set; under SLURM ``slurm-<job id>`` (``slurm-<array job>_<task>`` in an array),
which every rank of the job shares and a requeued job keeps; under torchrun with a rendezvous id
``torchrun-<id>``; else the start time and six random hex digits (``2026-11-23_14-05-09_3fa2c1``), so runs
started in the same second never share a folder. ``ckpt_path=<file>`` in ``<run>/checkpoints/`` continues in
``<run>``: one run, one folder, one summary. A resumed run's Hydra files go to ``.hydra/resumed-<time>/``.
``ckpt_path=auto`` needs an id a restart gets again (``run_id``, SLURM's or torchrun's): with a random one it
would start a new folder every time, so it is refused, naming the runs it could mean. ``name`` and ``run_id``
are checked before Hydra makes the folder (``name=../x`` makes nothing outside ``logs/``).
"""

from __future__ import annotations

import os
import secrets
import time
from functools import cache
from pathlib import Path

from omegaconf import OmegaConf

from minillm.errors import ConfigError, check_name
from minillm.model_config import PLACEMENTS, QK_NORMS
from minillm.training.checkpointing import RESUME_FILES
from minillm.training.optim import SCHEDULES
from minillm.training.run import slurm
from minillm.training.run.checks import CLIP_ALGORITHMS, PRECISIONS, TEST_WEIGHTS


def scheduler_id() -> str | None:
    """The id a restarted job gets again: SLURM's job (array task) id or torchrun's rendezvous id; else None."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}"
    if env.get("TORCHELASTIC_RUN_ID", "none") != "none":
        return f"torchrun-{env['TORCHELASTIC_RUN_ID']}"
    return None


@cache
def new_run_id() -> str:
    """This process's run id (computed once, so every resolution of the run dir agrees)."""
    return scheduler_id() or f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{secrets.token_hex(3)}"


def run_id(given: str | None) -> str:
    return str(given) if given not in (None, "") else new_run_id()


def resumable_runs(base: Path, limit: int = 3) -> list[Path]:
    """The newest run folders under base with a checkpoint ckpt_path=auto would resume from."""
    found = [p for p in base.glob("*") if any((p / "checkpoints" / f).is_file() for f in RESUME_FILES)]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)[:limit]


def _check_auto(base: Path, given_id: str | None, ckpt_path: str | None) -> None:
    """ckpt_path=auto needs an id a restart gets again: run_id, or SLURM's / torchrun's job id."""
    if ckpt_path != "auto" or given_id not in (None, "") or scheduler_id():
        return
    runs = resumable_runs(base)
    hint = ("; runs with a checkpoint: " + ", ".join(f"run_id={p.name}" for p in runs)) if runs else ""
    raise ConfigError(f"ckpt_path=auto needs the run to resume: add run_id=<id> (the run folder {base}/<id>) or "
                      f"give ckpt_path=<run>/checkpoints/<file>.ckpt{hint}")


def run_dir(log_dir: str, name: str, given_id: str | None, ckpt_path: str | None, train: bool = True) -> str:
    """``<log_dir>/<name>/runs/<run id>``, or the run folder of the checkpoint being resumed
    (``<run>/checkpoints/x.ckpt``); an evaluation of such a checkpoint (train=false) goes to
    ``<run>/evaluations/<id>``, beside the training's record, which it leaves as it is. ``name`` and ``run_id``
    are checked here, before Hydra makes the folder."""
    check_name("name", name)
    check_name("run_id", given_id, optional=True)
    if ckpt_path not in (None, "", "auto"):
        ckpt = Path(str(ckpt_path)).expanduser()
        if ckpt.parent.name == "checkpoints":
            run = ckpt.parent.parent
            return str(run if train is not False else run / "evaluations" / run_id(given_id))
    base = Path(str(log_dir)) / str(name) / "runs"
    _check_auto(base, given_id, ckpt_path)
    return f"{base}/{run_id(given_id)}"


def sweep_dir(log_dir: str, name: str, given_id: str | None, ckpt_path: str | None, launcher: str = "") -> str:
    """``<log_dir>/<name>/multiruns/<run id>``: a sweep's folder (its jobs are numbered below it). With
    ckpt_path=auto and no run_id, only a launcher that requeues the submitted jobs themselves (submitit: the
    job keeps the folder it was given) finds the folder again; a local sweep is refused."""
    check_name("name", name)
    check_name("run_id", given_id, optional=True)
    base = Path(str(log_dir)) / str(name) / "multiruns"
    local = "submitit" not in str(launcher).lower()
    if ckpt_path == "auto" and given_id in (None, "") and not scheduler_id() and local:
        raise ConfigError(f"ckpt_path=auto in a sweep needs run_id=<id>: the sweep's folder {base}/<id> is "
                          "found again by it")
    return f"{base}/{run_id(given_id)}"


@cache
def hydra_subdir(output_dir: str) -> str:
    """Where Hydra writes the composed config: ``.hydra``, or ``.hydra/resumed-<time>`` when the folder already
    holds a run's (a resumed run keeps the original command's files). Decided once per folder and process."""
    if (Path(output_dir) / ".hydra" / "config.yaml").exists():
        return f".hydra/resumed-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    return ".hydra"


def fixed_choices() -> dict[str, tuple]:
    """Every config key with fixed choices and its allowed values, from the code that checks them (--help lists
    them all: tests/test_train.py checks that none is missing)."""
    from minillm.model_config import INITS
    from minillm.mup import PARAMETRIZATIONS
    from minillm.norms.impl import IMPLS
    from minillm.norms.qk import QK_AXES, QK_GAINS, QK_SITES
    from minillm.placements import BRANCH_SCALES
    from minillm.training.callbacks.progress import MODES
    from minillm.training.callbacks.spike import STORES
    from minillm.training.lit_module import COMPILE_MODES, LOSS_IMPLS
    from minillm.training.optim import DECAY_SHAPES, MUON_LR_RULES

    return {"placement": PLACEMENTS, "test_weights": TEST_WEIGHTS, "trainer.precision": PRECISIONS,
            "trainer.gradient_clip_algorithm": CLIP_ALGORITHMS,
            "model.qk_norm": QK_NORMS, "model.qk_norm_axis": QK_AXES, "model.qk_norm_gains": (*QK_GAINS, None),
            "model.qk_norm_on": QK_SITES, "model.branch_scale": BRANCH_SCALES, "model.init": INITS,
            "model.norm_impl": IMPLS, "model.parametrization": PARAMETRIZATIONS,
            "optimizer.adjust_lr_fn": MUON_LR_RULES,
            "scheduler.kind": SCHEDULES, "scheduler.decay_shape": DECAY_SHAPES,
            "module.loss_impl": LOSS_IMPLS, "module.compile_mode": COMPILE_MODES,
            "callbacks.progress_bar.mode": MODES, "callbacks.spike.store": STORES}


def choices(kind: str) -> str:
    """--help's list of the keys with fixed choices, one ``key: a, b, c`` line each (``kind``: all)."""
    return "\n".join(f"{key}: {', '.join('null' if v is None else str(v) for v in values)}"
                      for key, values in fixed_choices().items())


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


def minimum(*values: object) -> object:
    """``${minillm.min:a,b}``; a value that is not a number is passed through, so the check of the field it
    came from names it (``trainer.max_steps='ten' is invalid``) instead of the resolver failing."""
    odd = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))]
    return odd[0] if odd else min(values)


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("minillm.slurm_gpus", slurm_gpus, replace=True)
    OmegaConf.register_new_resolver("minillm.slurm_tasks", slurm_tasks, replace=True)
    OmegaConf.register_new_resolver("minillm.slurm_cpus", slurm.slurm_cpus, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("minillm.choices", choices, replace=True)
    OmegaConf.register_new_resolver("minillm.min", minimum, replace=True)
    # use_cache: the resolved value travels with the config to launcher processes (joblib, submitit)
    OmegaConf.register_new_resolver("minillm.run_id", run_id, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("minillm.run_dir", run_dir, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("minillm.sweep_dir", sweep_dir, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("minillm.hydra_subdir", hydra_subdir, replace=True)
