"""The last line of a run and of a sweep: how it ended, where its results are, and what to do next.

    run completed after 1600 steps (final val loss 1.6640, test loss 1.6450): logs/default/runs/<id> (summary.json,
    csv/metrics.csv, train.log); table and plots: python -m minillm.analysis.report logs/default/runs/<id>
    run stopped by SIGTERM at step 400 in the fit (preempted): resume this run with the same command plus
    ckpt_path=logs/default/runs/<id>/checkpoints/preempted.ckpt
    sweep ended, 6 jobs: 5 completed, 1 diverged; logs/my_sweep/multiruns/<id>; table and plots: python -m
    minillm.analysis.report logs/my_sweep/multiruns/<id>

``SweepEnd`` is the Hydra callback that prints a sweep's (configs/hydra/default.yaml).
"""

from __future__ import annotations

import json
import math
import shlex
import signal
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from minillm import schema
from minillm.analysis.runs import find_runs
from minillm.training.checkpointing import find_resume_checkpoint
from minillm.training.run.naming import in_multirun

OUTCOMES = ("completed", "diverged", "not_trained")  # statuses of a run that has ended (minillm.outcome)


def read_record(folder: Path, name: str = "summary.json") -> dict[str, Any]:
    """A run's summary.json (or evaluation.json) as a dict; empty when there is none (yet)."""
    path = folder / name
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}


def has_ended(record: dict[str, Any], max_steps: int, test: bool) -> bool:
    """The run has an outcome (diverged, or trained its max_steps: a larger trainer.max_steps continues it) and,
    when it is to be tested, its held-out test was done."""
    trained = record.get("status") == "diverged" or (record.get("steps") or 0) >= max_steps
    return record.get("status") in OUTCOMES and trained and (not test or record.get("test_weights") is not None)


def crashed_for_good(record: dict[str, Any], folder: Path) -> bool:
    """The run crashed (status failed) and left no checkpoint to resume from: ``ckpt_path=auto`` leaves it as it is
    (its record is its result; removing its folder runs it again), so a rerun sweep goes on with its other jobs."""
    return record.get("status") == "failed" and find_resume_checkpoint(folder) is None


def crashed_line(folder: Path, record: dict[str, Any]) -> str:
    where = f"at step {record.get('steps')}" if record.get("steps") is not None else "before its first step"
    error = " ".join(str(record.get("error") or "no error recorded").split())  # one line
    return (f"ckpt_path=auto: this run crashed {where} ({error[:200]}) and left no checkpoint; it is left as it is "
            f"(remove {folder} to run it again)")


def resume_hint(cfg: DictConfig, folder: Path) -> str:
    """The command that continues a stopped run: in a sweep, the sweep (each job in its own folder); else the run
    from its newest resumable checkpoint."""
    if in_multirun():
        sweep = Path(HydraConfig.get().sweep.dir)
        extra = "ckpt_path=auto" if cfg.get("run_id") not in (None, "") else f"run_id={sweep.name} ckpt_path=auto"
        return (f"resume this sweep with the same command plus {extra} (each job continues in its folder; a job that "
                "has ended, or crashed without a checkpoint, is left as it is)")
    ckpt = find_resume_checkpoint(folder)
    if ckpt is None:
        return "it has no checkpoint to resume from: run the same command again"
    return f"resume this run with the same command plus {shlex.quote(f'ckpt_path={ckpt}')}"


def _loss(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) and math.isfinite(value) else str(value)


def outcome_line(folder: Path, record: dict[str, Any], evaluation: bool = False) -> str:
    """``run <status> after N steps (...): <folder> (files); table and plots: ...`` for a run that has ended; for an
    evaluation (train=false) its test loss and record."""
    if evaluation:
        return (f"evaluation of {record.get('test_weights')}: test loss {_loss(record.get(schema.TEST_LOSS))}; "
                f"{folder / 'evaluation.json'}")
    status = record.get("status")
    if status is None:  # callbacks without RunSummary
        return f"run ended: {folder} (csv/metrics.csv, train.log; no summary.json: callbacks without the summary)"
    detail = f"final val loss {_loss(record.get(schema.FINAL_VAL_LOSS))}"
    if record.get("test_weights") is not None:
        detail += f", test loss {_loss(record.get(schema.TEST_LOSS))}"
    if status == "diverged":
        detail = f"at step {record.get(schema.DIVERGED_STEP)}: {record.get('diverged_reason')}"
    unigram = record.get(schema.UNIGRAM_LOSS)
    if status in ("completed", "not_trained") and record.get(schema.FAILED) and unigram is not None:
        detail += (f"; it counts as failed: final val loss >= {_loss(unigram)}, the unigram loss (what token "
                   "frequencies alone give)")
    return (f"run {status} after {record.get('steps')} steps ({detail}): {folder} (summary.json, csv/metrics.csv, "
            f"train.log); table and plots: {report_command(folder)}")


def report_command(folder: Path) -> str:
    """The report command for a run or sweep folder, as a shell takes it (a path with spaces quoted)."""
    return f"python -m minillm.analysis.report {shlex.quote(str(folder))}"


def stopped_line(cfg: DictConfig, folder: Path, signum: int, phase: str, record: dict[str, Any]) -> str:
    """A run stopped by a signal: where, and how to resume it."""
    name = signal.Signals(signum).name
    if phase == "set-up":
        kept = "the run folder is as it was" if record else "nothing was kept"
        return f"run stopped by {name} during set-up, before training: {kept}; run the same command again"
    where = f"at step {record.get('steps')}" if record.get("steps") is not None else "before its first step"
    return f"run stopped by {name} {where} in the {phase} (preempted): {resume_hint(cfg, folder)}"


def failed_line(cfg: DictConfig, folder: Path, error: BaseException, record: dict[str, Any]) -> str:
    """A run that crashed (a bug, an out-of-memory error; its traceback follows): where it stopped and how to go on."""
    where = f"at step {record.get('steps')}" if record.get("steps") is not None else "before its first step"
    return f"run failed {where} ({type(error).__name__}: {error}): {folder}; {resume_hint(cfg, folder)}"


def count_line(folder: Path) -> str:
    """``sweep ended, N jobs: a completed, b diverged, ...; <folder>; table and plots: ...``"""
    runs = find_runs(folder)
    counts = Counter(str(r.summary.get("status")) for r in runs)
    ended = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"
    return (f"sweep ended, {len(runs)} jobs: {ended}; {folder}; "
            f"table and plots: {report_command(folder)}")


class SweepEnd(Callback):
    """Hydra callback: the sweep's closing line, printed once all its jobs ended (not into a job's train.log)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print(count_line(Path(config.hydra.sweep.dir)), flush=True)
