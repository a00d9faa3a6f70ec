"""Every job of a sweep checked before the first one trains: a bad value in a later job (``-m seed=0,abc``) is the
one-line error of that job, naming its sweep values, before anything is written, not a stop after job 0 trained.

A Hydra callback (configs/hydra/default.yaml): at the start of a multirun it composes each job's config as Hydra's
basic sweeper will (the sweep's overrides with ``hydra.sweeper.params``) and runs the checks of
``minillm.training.run.checks`` that need no data (check_config, check_model_early). Another sweeper (Optuna) picks
its jobs as it goes: each is checked when it starts, as a single run is.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from minillm.errors import ConfigError
from minillm.training.run import checks
from minillm.training.run.hydra import one_line

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_jobs(config: DictConfig) -> tuple[list[list[str]], set[str]] | None:
    """Each job's overrides, in the sweeper's order, and the keys the sweep varies; None for a sweeper other than
    the basic one."""
    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != BASIC_SWEEPER:
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    arguments = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    arguments += OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    parsed = OverridesParser.create().parse_overrides(arguments)
    varied = {o.get_key_element() for o in parsed if o.is_sweep_override()}
    batches = BasicSweeper.split_arguments(parsed, None)
    return [job for batch in batches for job in batch], varied


def job_error(err: BaseException, num: int, job: list[str], varied: set[str]) -> ConfigError | None:
    """The job's error as one line naming the job and its sweep values; None for an error that is not about the
    config (the job itself then meets it)."""
    line = one_line(err)
    if line is None:
        return None
    values = " ".join(o for o in job if o.split("=", 1)[0] in varied)
    what, _, message = line.partition(": ")
    refused = ConfigError(f"{message} (in job #{num} of the sweep: {values}; no job has run)")
    refused.what = what
    return refused


def check_job(config: DictConfig, job: list[str]) -> None:
    """Compose the job's config (as the launcher will) and run the checks that need no data."""
    cfg = GlobalHydra.instance().hydra.config_loader.load_sweep_config(config, job)
    with open_dict(cfg):
        cfg.paths.output_dir = "<the job's folder>"  # Hydra sets it when the job starts; no check reads it
        del cfg["hydra"]
    checks.check_config(cfg)
    checks.check_model_early(cfg)


class SweepCheck(Callback):
    """Hydra callback: every job of a (basic) sweep checked at its start (see the module docstring)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        found = sweep_jobs(config)
        if found is None:
            return
        jobs, varied = found
        for num, job in enumerate(jobs):
            try:
                check_job(config, job)
            except Exception as err:  # noqa: BLE001  (a refusal becomes the job's line; anything else the job's own)
                refused = job_error(err, num, job, varied)
                if refused is None:  # not a refusal: that job will say it itself; the later jobs are still checked
                    continue
                print(f"{refused.what}: {refused}", file=sys.stderr, flush=True)
                raise SystemExit(2) from None  # Hydra turns a callback's exceptions into warnings; not an exit
