"""Loggers: a CSV log that survives several writers, and a W&B logger that never stops training."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn


class AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, made safe for a file that other writers wrote before: it keeps an existing
    metrics.csv (Lightning deletes it) and takes the header from the file at every save, so a resumed run, or
    the test pass of a DDP run whose fit ran in other processes, adds rows instead of failing or erasing."""

    def _check_log_dir_exists(self) -> None:
        pass  # keep what is there

    def _file_header(self) -> list[str]:
        if not self._fs.isfile(self.metrics_file_path):
            return []
        with self._fs.open(self.metrics_file_path, "r", newline="") as f:
            return next(csv.reader(f), [])

    def save(self) -> None:
        if not self.metrics:
            return
        on_disk = self._file_header()
        self.metrics_keys = sorted(set(on_disk) | set(self.metrics_keys) | set().union(*self.metrics))
        if on_disk and set(self.metrics_keys) != set(on_disk):
            self._rewrite_with_new_header(self.metrics_keys)
        with self._fs.open(self.metrics_file_path, mode="a" if on_disk else "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
            if not on_disk:
                writer.writeheader()
            writer.writerows(self.metrics)
        self.metrics = []

    def drop_from(self, step: int) -> None:
        """Remove the rows logged at ``step`` or later (a run resumed from a checkpoint at that step logs them
        again)."""
        if not self._fs.isfile(self.metrics_file_path):
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as f:
            reader = csv.DictReader(f)
            header, rows = reader.fieldnames or [], list(reader)
        kept = [r for r in rows if not (r.get("step") not in (None, "") and int(float(r["step"])) >= step)]
        if len(kept) != len(rows):
            with self._fs.open(self.metrics_file_path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=header)
                writer.writeheader()
                writer.writerows(kept)


class AppendingCSVLogger(CSVLogger):
    """CSVLogger writing through AppendingWriter: one metrics.csv per run directory, across resumes and
    processes. ``resume_at(step)`` drops rows a resumed run will log again."""

    @property
    @rank_zero_experiment
    def experiment(self) -> AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingWriter(log_dir=self.log_dir)
        return self._experiment

    @rank_zero_only
    def resume_at(self, step: int) -> None:
        self.experiment.drop_from(step)


class SafeWandbLogger(WandbLogger):
    """WandbLogger that respects ``WANDB_MODE`` and falls back to offline logging when W&B cannot start.

    ``run_tags`` are added to ``tags`` (the config gives norm:, placement:, lr:, precision:, seed: tags).
    ``WANDB_MODE=online`` (or ``offline: false``) logs online; with no network or no API key the run
    continues offline with a warning, and ``wandb sync <run dir>/wandb/offline-run-*`` uploads it later.
    """

    def __init__(self, *args, offline: bool = True, init_timeout: float = 30.0, run_tags: Sequence[str] = (),
                 **kwargs):
        mode = os.environ.get("WANDB_MODE", "").lower()
        if mode in ("online", "run"):
            offline = False
        elif mode in ("offline", "dryrun"):
            offline = True
        kwargs.setdefault("settings", {"init_timeout": init_timeout, "silent": True})
        kwargs["tags"] = [*(kwargs.get("tags") or []), *run_tags]  # the user's tags, then norm:/placement:/...
        super().__init__(*args, offline=offline, **kwargs)
        self._wandb_init.pop("anonymous", None)  # deprecated in wandb; passing it at all prints a warning

    @property
    @rank_zero_experiment
    def experiment(self):
        import wandb

        if self._experiment is None and wandb.run is not None:
            # a run left open by an earlier logger in this process (the previous job of an in-process
            # Hydra sweep): WandbLogger would log this run into it
            wandb.finish()
        mode = os.environ.get("WANDB_MODE")  # WandbLogger sets WANDB_MODE=dryrun for the whole process
        try:
            return super().experiment
        except Exception as err:  # no network, no API key, server down: keep training
            reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
            rank_zero_warn(f"W&B could not start online ({reason}); logging offline instead.")
            if wandb.run is not None:
                wandb.finish()
            self._offline = True
            self._experiment = None
            self._wandb_init["mode"] = "offline"
            return super().experiment
        finally:
            if mode is None:
                os.environ.pop("WANDB_MODE", None)
            else:
                os.environ["WANDB_MODE"] = mode
