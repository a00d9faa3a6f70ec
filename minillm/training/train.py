"""Train from the Hydra config in configs/: check it, resolve resume, build data, model, callbacks, loggers and
trainer, fit, then evaluate on the held-out split. ``python train.py`` and ``minillm-train`` run ``main``.

    python train.py                                   # default run on the embedded Shakespeare corpus
    python train.py norm=layernorm placement=post optimizer.lr=1e-3 trainer.precision=bf16-mixed seed=1
    python train.py -m norm=layernorm,rmsnorm,batchnorm placement=pre,post   # sweep

The parts live in minillm/training/run/: job.py (prepare, then run), checks.py (what no component checks), resume.py,
naming.py (W&B names and groups), build.py, folder.py (the run folder's lock, a refused start's clean-up), hydra.py
(one-line errors).
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from minillm import _compat, schema
from minillm.errors import ConfigError, JobStopped, disk_error, parse_in_one_line
from minillm.training.run import resolvers
from minillm.training.run.closing import (
    crashed_for_good,
    crashed_line,
    failed_line,
    has_ended,
    outcome_line,
    read_record,
    stopped_line,
)
from minillm.training.run.folder import RunFolderLock, discard_start
from minillm.training.run.hydra import config_dir, errors_in_one_line, route_library_logs
from minillm.training.run.job import Job, fit, prepare, run, test, train  # noqa: F401  (minillm.training.train.<name>)
from minillm.training.run.naming import in_multirun
from minillm.training.run.resume import EVALUATION_FILE
from minillm.training.run.signals import Interrupted, StopSignals, signal_of

log = logging.getLogger("minillm")


def quiet_run_log() -> None:
    """Stop writing the run folder's train.log (a start that is refused or undone leaves the folder as it was: it may
    be another run's, which is training)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


def stop(line: str, code: int = 2) -> None:
    """Log the line and exit with ``code``; in a sweep, a job's own error (code 2) fails that job alone: Hydra runs
    the other jobs past an exception, while a SystemExit would end the sweep (under joblib, its running jobs too)."""
    log.error(line)
    if code == 2 and in_multirun():
        raise JobStopped(line)
    sys.exit(code)


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    """One run (or one job of a sweep) in its folder, which it holds locked from start to end. A refused start
    leaves nothing: a fresh folder goes, and in a folder that holds a run only this start's Hydra files; so does a
    start stopped by a signal before it trained. ``ckpt_path=auto`` on a run that has ended does nothing, nor on one
    that crashed and left no checkpoint. The run ends with a closing line (minillm.training.run.closing)."""
    route_library_logs()
    out_dir, subdir = Path(cfg.paths.output_dir), resolvers.hydra_subdir(str(cfg.paths.output_dir))
    record_name = "summary.json" if cfg.get("train", True) else EVALUATION_FILE

    def undo_start() -> None:
        quiet_run_log()
        if lock.held or subdir != ".hydra":  # never in a folder another run holds
            discard_start(out_dir, subdir, fresh=lock.held and subdir == ".hydra", log_dir=cfg.paths.log_dir)

    with RunFolderLock(out_dir) as lock, StopSignals() as signals:
        try:
            lock.acquire()
            record = read_record(out_dir)
            if cfg.get("ckpt_path") == "auto" and has_ended(record, cfg.trainer.max_steps, cfg.get("test", True)):
                undo_start()
                log.info(f"ckpt_path=auto: this run has ended, nothing to resume; {outcome_line(out_dir, record)}")
                return record.get(schema.FINAL_VAL_LOSS)
            if cfg.get("ckpt_path") == "auto" and cfg.get("train", True) and crashed_for_good(record, out_dir):
                undo_start()
                log.info(crashed_line(out_dir, record))
                return None
            job = prepare(cfg)
        except Interrupted as stopped:
            undo_start()
            stop(stopped_line(cfg, out_dir, stopped.signum, "set-up", read_record(out_dir)), stopped.code)
        except (ConfigError, OSError) as err:
            line = f"{err.what}: {err}" if isinstance(err, ConfigError) else disk_error(err)
            if line is None:
                raise
            log.debug("where it was raised (hydra.verbose=minillm shows this)", exc_info=err)
            undo_start()
            stop(line)
        try:
            metrics = run(job, signals)
        except SystemExit as stopped:  # a stop signal (here, or in DDP's processes: run.job.fit)
            signum = signal_of(stopped.code)
            if signum is None:
                raise
            if signals.phase == "set-up":
                undo_start()
            log.info(stopped_line(cfg, out_dir, signum, signals.phase, read_record(out_dir, record_name)))
            raise
        except Exception as err:  # found while training: a token store changed on disk, a full disk
            line = f"{err.what}: {err}" if isinstance(err, ConfigError) else disk_error(err, where=out_dir)
            if line is None:  # a bug: its traceback follows the closing line
                log.error(failed_line(cfg, out_dir, err, read_record(out_dir, record_name)))
                raise
            stop(line)
        line = outcome_line(out_dir, read_record(out_dir, record_name), evaluation=not cfg.get("train", True))
        if signals.deferred:
            line += f" (a {signal.Signals(signals.deferred).name} during the final writes waited for them)"
        log.info(line)
    return metrics.get(cfg.get("optimized_metric"))


def main() -> float | None:
    """``python train.py`` and ``minillm-train``: Hydra's run, with Hydra's own errors (an unknown option, a
    misspelt key, an override it cannot parse, a folder it cannot make, a flag it does not know) as one line and
    exit code 2."""
    parse_in_one_line(_compat.hydra_args_parser().parse_args)  # Hydra parses the same again
    try:
        with errors_in_one_line():
            return hydra_main()
    except KeyboardInterrupt:  # before a job's handlers are set (Hydra composing the config) or between sweep jobs
        print("stopped by SIGINT (Ctrl-C) outside a run (Hydra composing its config, or between a sweep's jobs)",
              file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
