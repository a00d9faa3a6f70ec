"""A W&B logger that never stops training: offline by default, falls back to offline when online fails."""

from __future__ import annotations

import os
from collections.abc import Sequence

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_warn


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
