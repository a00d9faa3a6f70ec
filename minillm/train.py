"""Train from the Hydra config in configs/: check it, resolve resume, build data, model, callbacks, loggers and
trainer, fit, then evaluate on the held-out split. ``python train.py`` and ``minillm-train`` run ``main``.

    python train.py                                   # default run on the embedded Shakespeare corpus
    python train.py norm=layernorm placement=post optimizer.lr=1e-3 trainer.precision=bf16-mixed seed=1
    python train.py -m norm=layernorm,rmsnorm,batchnorm placement=pre,post   # sweep

The parts live in minillm/run/: job.py (prepare, then run), checks.py (what no component checks), resume.py,
naming.py (W&B names and groups), build.py, folder.py (the run folder's lock, a refused start's clean-up), hydra.py
(one-line errors).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from minillm.errors import ConfigError, disk_error
from minillm.run import resolvers
from minillm.run.folder import RunFolderLock, discard_start
from minillm.run.hydra import config_dir, errors_in_one_line, route_library_logs
from minillm.run.job import STOP_CODES, Job, fit, prepare, run, test, train  # noqa: F401  (minillm.train.<name>)

log = logging.getLogger("minillm")


def stop(line: str) -> None:
    log.error(line)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    """One run (or one job of a sweep) in its folder, which it holds locked from start to end. A refused start
    leaves nothing: a fresh folder goes, and in a folder that holds a run only this start's Hydra files."""
    route_library_logs()
    out_dir, subdir = Path(cfg.paths.output_dir), resolvers.hydra_subdir(str(cfg.paths.output_dir))
    with RunFolderLock(out_dir) as lock:
        try:
            lock.acquire()
            job = prepare(cfg)
        except (ConfigError, OSError) as err:
            line = f"{err.what}: {err}" if isinstance(err, ConfigError) else disk_error(err)
            if line is None:
                raise
            log.debug("where it was raised (hydra.verbose=minillm shows this)", exc_info=err)
            if lock.held or subdir != ".hydra":  # never in a folder another run holds
                discard_start(out_dir, subdir, fresh=lock.held and subdir == ".hydra", log_dir=cfg.paths.log_dir)
            stop(line)
        try:
            metrics = run(job)
        except (ConfigError, OSError) as err:  # found while training: a token store changed on disk, a full disk
            line = f"{err.what}: {err}" if isinstance(err, ConfigError) else disk_error(err)
            if line is None:
                raise
            stop(line)
    return metrics.get(cfg.get("optimized_metric"))


def main() -> float | None:
    """``python train.py`` and ``minillm-train``: Hydra's run, with Hydra's own errors (an unknown option, a
    misspelt key, an override it cannot parse, a folder it cannot make) as one line and exit code 2."""
    with errors_in_one_line():
        return hydra_main()
