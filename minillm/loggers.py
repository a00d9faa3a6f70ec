"""A W&B logger that never stops training: offline by default, falls back to offline when online fails."""

from __future__ import annotations

import os

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_warn


class SafeWandbLogger(WandbLogger):
    """WandbLogger that respects ``WANDB_MODE`` and falls back to offline logging when W&B cannot start.

    ``WANDB_MODE=online`` (or ``offline: false``) logs online; with no network or no API key the run
    continues offline with a warning, and ``wandb sync <run dir>/wandb/offline-run-*`` uploads it later.
    """

    def __init__(self, *args, offline: bool = True, init_timeout: float = 30.0, **kwargs):
        mode = os.environ.get("WANDB_MODE", "").lower()
        if mode in ("online", "run"):
            offline = False
        elif mode in ("offline", "dryrun"):
            offline = True
        kwargs.setdefault("settings", {"init_timeout": init_timeout, "silent": True})
        super().__init__(*args, offline=offline, **kwargs)

    @property
    @rank_zero_experiment
    def experiment(self):
        try:
            return super().experiment
        except Exception as err:  # no network, no API key, server down: keep training
            import wandb

            rank_zero_warn(f"W&B could not start online ({type(err).__name__}: {err}); logging offline instead.")
            if wandb.run is not None:
                wandb.finish()
            self._offline = True
            self._experiment = None
            self._wandb_init["mode"] = "offline"
            return super().experiment
