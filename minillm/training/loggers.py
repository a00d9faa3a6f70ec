"""Loggers: a CSV log that survives several writers, and a W&B logger that never stops training."""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from minillm import _compat
from minillm.errors import check_bool, check_int
from minillm.metrics import BEST_IS_HIGH, BEST_IS_LOW, PER_SITE, parse_metric

log = logging.getLogger("minillm")


@_compat.keep_existing_log_dir
class AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, made safe for a file that other writers wrote before: it keeps an existing
    metrics.csv (Lightning deletes it) and takes the header from the file at every save, so a resumed run, or
    the test pass of a DDP run whose fit ran in other processes, adds rows instead of failing or erasing."""

    def _file_header(self) -> list[str]:
        if not _compat.logger_fs(self).isfile(self.metrics_file_path):
            return []
        with _compat.logger_fs(self).open(self.metrics_file_path, "r", newline="") as f:
            return next(csv.reader(f), [])

    def save(self) -> None:
        if not self.metrics:
            return
        on_disk = self._file_header()
        self.metrics_keys = sorted(set(on_disk) | set(self.metrics_keys) | set().union(*self.metrics))
        if on_disk and set(self.metrics_keys) != set(on_disk):
            _compat.rewrite_csv_header(self, self.metrics_keys)
        with _compat.logger_fs(self).open(self.metrics_file_path, mode="a" if on_disk else "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
            if not on_disk:
                writer.writeheader()
            writer.writerows(self.metrics)
        self.metrics = []

    def drop_from(self, step: int) -> None:
        """Remove the rows logged at ``step`` or later (a run resumed from a checkpoint at that step logs them
        again)."""
        if not _compat.logger_fs(self).isfile(self.metrics_file_path):
            return
        with _compat.logger_fs(self).open(self.metrics_file_path, "r", newline="") as f:
            reader = csv.DictReader(f)
            header, rows = reader.fieldnames or [], list(reader)
        kept = [r for r in rows if not (r.get("step") not in (None, "") and int(float(r["step"])) >= step)]
        if len(kept) != len(rows):
            with _compat.logger_fs(self).open(self.metrics_file_path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=header)
                writer.writeheader()
                writer.writerows(kept)


class AppendingCSVLogger(CSVLogger):
    """CSVLogger writing through AppendingWriter: one metrics.csv per run directory, across resumes and
    processes. ``resume_at(step)`` drops rows a resumed run will log again."""

    @property
    @rank_zero_experiment
    def experiment(self) -> AppendingWriter:
        if _compat.logger_experiment(self) is None:
            _compat.logger_fs(self).makedirs(self.root_dir, exist_ok=True)
            _compat.set_logger_experiment(self, AppendingWriter(log_dir=self.log_dir))
        return _compat.logger_experiment(self)

    @rank_zero_only
    def resume_at(self, step: int) -> None:
        self.experiment.drop_from(step)


PER_LAYER = tuple(f"{kind}/" for kind in PER_SITE)  # logged as depth-profile tables, not one panel per site


class SafeWandbLogger(WandbLogger):
    """WandbLogger that respects ``WANDB_MODE``, falls back to offline logging when W&B cannot start, and
    shows a run the way a comparison of norms reads it.

    - ``WANDB_MODE=online`` (or ``offline: false``) logs online; with no network or no API key the run
      continues offline with a warning. Once the run starts, one line says where it is: its URL, or its
      offline folder and the ``wandb sync`` command that uploads it.
    - The run summary is the result: best val/test losses (min) and the stability maxima (max) as W&B
      summaries, then, through ``record_summary``, every field of summary.json (RunSummary calls it).
    - The per-layer and per-norm-site metrics (``layer/<i>/...``, ``norm/<site>/...``) become depth profiles:
      every ``profile_every_n_steps`` steps a ``depth/layers`` table (a row per layer) and a
      ``depth/norm_sites`` table (a row per norm module), with line charts of residual RMS and gradient norm
      against depth, instead of one scalar panel per layer and site. ``per_layer_scalars=true`` logs the
      scalars too; the CSV log always has them.
    - ``run_tags`` are added to ``tags`` (the config gives norm:, placement:, lr:, precision:, seed: tags).
    """

    def __init__(self, *args, offline: bool = True, init_timeout: float = 30.0, run_tags: Sequence[str] = (),
                 per_layer_scalars: bool = False, profile_every_n_steps: int = 100, **kwargs):
        mode = os.environ.get("WANDB_MODE", "").lower()
        if mode in ("online", "run"):
            offline = False
        elif mode in ("offline", "dryrun"):
            offline = True
        check_bool("logger.wandb.per_layer_scalars", per_layer_scalars)
        check_int("logger.wandb.profile_every_n_steps", profile_every_n_steps, low=1)
        kwargs.setdefault("settings", {"init_timeout": init_timeout, "silent": True})
        kwargs["tags"] = [*(kwargs.get("tags") or []), *run_tags]  # the user's tags, then norm:/placement:/...
        super().__init__(*args, offline=offline, **kwargs)
        _compat.wandb_init_kwargs(self).pop("anonymous", None)  # deprecated in wandb: passing it prints a warning
        self.per_layer_scalars, self.profile_every_n_steps = per_layer_scalars, profile_every_n_steps
        self._announced = False
        self._wandb_dir_before: tuple[str | None] | None = None  # (WANDB_DIR before this run set it,)

    @property
    @rank_zero_experiment
    def experiment(self):
        import wandb

        if _compat.logger_experiment(self) is None and wandb.run is not None:
            # a run left open by an earlier logger in this process (the previous job of an in-process
            # Hydra sweep): WandbLogger would log this run into it
            wandb.finish()
        mode = os.environ.get("WANDB_MODE")  # WandbLogger sets WANDB_MODE=dryrun for the whole process
        if _compat.logger_experiment(self) is None and self.save_dir and self._wandb_dir_before is None:
            # the processes DDP forks attach to this run with W&B's settings from the environment: without
            # WANDB_DIR they would write its media (tables) under ./wandb of the working directory
            self._wandb_dir_before = (os.environ.get("WANDB_DIR"),)
            os.environ["WANDB_DIR"] = str(self.save_dir)
        try:
            run = super().experiment
        except Exception as err:  # no network, no API key, server down: keep training
            reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
            rank_zero_warn(f"W&B could not start online ({reason}); logging offline instead.")
            if wandb.run is not None:
                wandb.finish()
            _compat.wandb_go_offline(self)
            run = super().experiment
        finally:
            if mode is None:
                os.environ.pop("WANDB_MODE", None)
            else:
                os.environ["WANDB_MODE"] = mode
        if not self._announced:
            self._announced = True
            self._start(run)
        return run

    def _start(self, run) -> None:
        for key in BEST_IS_LOW:
            run.define_metric(key, summary="min")
        for key in BEST_IS_HIGH:
            run.define_metric(key, summary="max")
        if _compat.wandb_offline(self):
            folder = Path(run.dir).parent
            log.info(f"W&B: offline run {run.id} in {folder}; upload it with: wandb sync {folder}")
        else:
            log.info(f"W&B: {run.url}")

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        per_layer = {k: v for k, v in metrics.items() if k.startswith(PER_LAYER)}
        rest = metrics if self.per_layer_scalars else {k: v for k, v in metrics.items() if k not in per_layer}
        if rest:
            super().log_metrics(rest, step=step)
        if per_layer and step is not None and step % self.profile_every_n_steps == 0:
            self._log_depth_profile(per_layer, step)

    def _log_depth_profile(self, metrics: Mapping[str, float], step: int) -> None:
        """Tables of the step's per-layer and per-norm-site values, and line charts against depth."""
        import wandb

        layers, sites = depth_profile(metrics)
        logged: dict[str, Any] = {"trainer/global_step": step}
        for key, rows in (("depth/layers", layers), ("depth/norm_sites", sites)):
            if rows:
                columns = list(rows[0])
                table = wandb.Table(columns=["step", *columns], data=[[step, *r.values()] for r in rows])
                logged[key] = table
                for metric in ("resid_rms", "grad_norm"):
                    if key == "depth/layers" and metric in columns:
                        logged[f"depth/{metric}_vs_layer"] = wandb.plot.line(
                            table, "layer", metric, title=f"{metric} by layer, step {step}")
        self.experiment.log(logged)

    @rank_zero_only
    def finish(self) -> None:
        """End the W&B run: everything logged is written (offline) or uploaded, the run marked finished."""
        run = _compat.logger_experiment(self)
        if run is not None:
            run.finish()
            _compat.set_logger_experiment(self, None)
        if self._wandb_dir_before is not None:  # the environment as it was before this run
            (before,), self._wandb_dir_before = self._wandb_dir_before, None
            if before is None:
                os.environ.pop("WANDB_DIR", None)
            else:
                os.environ["WANDB_DIR"] = before

    @rank_zero_only
    def record_summary(self, summary: Mapping[str, Any]) -> None:
        """Copy the run's summary (summary.json) into the W&B run summary: one source for both views."""
        flat = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
        flat.update({f"{k}.{kk}": vv for k, v in summary.items() if isinstance(v, Mapping) for kk, vv in v.items()})
        self.experiment.summary.update({k: v for k, v in flat.items() if v is not None})


def depth_profile(metrics: Mapping[str, float]) -> tuple[list[dict], list[dict]]:
    """Rows per layer ({"layer": i, <metric>: value}) and per norm site ({"site", "layer", <metric>: value})
    of ``layer/<i>/<metric>`` and ``norm/<site>/<metric>`` values (the site's layer is -1 outside a block)."""
    layers: dict[int, dict] = {}
    sites: dict[str, dict] = {}
    for key, value in metrics.items():
        kind, name, metric = parse_metric(key) or (None, None, None)
        if kind == "layer" and name.isdigit():
            layers.setdefault(int(name), {"layer": int(name)})[metric] = float(value)
        elif kind == "norm":
            parts = name.split(".")
            layer = int(parts[1]) if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit() else -1
            sites.setdefault(name, {"site": name, "layer": layer})[metric] = float(value)

    def rows(found: dict) -> list[dict]:
        """Rows in order of depth (then site name), every row with every column."""
        columns = sorted({c for r in found.values() for c in r} - {"site", "layer"})
        keys = ["site", "layer"] if any("site" in r for r in found.values()) else ["layer"]
        ordered = sorted(found.values(), key=lambda r: (r["layer"] if r["layer"] >= 0 else 1 << 30, r.get("site", "")))
        return [{**{k: r[k] for k in keys}, **{c: r.get(c) for c in columns}} for r in ordered]

    return rows(layers), rows(sites)


def tensorboard_logger(**kwargs: Any) -> Any:
    """logger=tensorboard: Lightning's TensorBoardLogger, which writes through tensorboard (minillm[tensorboard],
    which also has the viewer) or tensorboardX; when neither is installed, one config error that says what to install
    (not Lightning's ModuleNotFoundError)."""
    import importlib

    from minillm.errors import ConfigError

    for module in ("tensorboard", "tensorboardX"):
        try:
            importlib.import_module(module)
            break
        except ImportError:
            continue
    else:
        raise ConfigError("logger=tensorboard needs tensorboard (or tensorboardX): pip install 'minillm[tensorboard]' "
                          "(or pip install tensorboard, which also has the viewer); allowed without it: logger=wandb, "
                          "logger=csv, logger=none")
    from lightning.pytorch.loggers import TensorBoardLogger

    class OneFileTensorBoardLogger(TensorBoardLogger):
        """Keeps one event file open from fit through test: Lightning closes the writer after fit and the test pass
        opens another, whose file name (the second it was made in) is the first's in a short run, replacing it."""

        @rank_zero_only
        def finalize(self, status: str) -> None:
            if _compat.logger_experiment(self) is not None:
                self.experiment.flush()
            self.save()

        def finish(self) -> None:  # train.py, when the run ends
            if _compat.logger_experiment(self) is not None:
                self.experiment.close()

    return OneFileTensorBoardLogger(**kwargs)
