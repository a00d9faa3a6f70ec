"""RunTotals: the run-level numbers of summary.json, owned in one place with one state_dict.

The callbacks that measure feed it (``RunTotals.of(trainer)``): StabilityMonitor the maxima and the counts of
every step, DivergenceGuard the divergence it found; RunSummary reads ``values()``. No callback reads another's
attributes, and a resumed run continues every total, because they travel in this callback's checkpoint state.
Adding a run-level number to summary.json is one call where it is measured (its name is the summary field).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import lightning as L
import torch
from torch import Tensor

from minillm import schema

# the totals summary.json always has (null until measured); any other total a callback records is added to them
TOTALS = (schema.MAX_GRAD_NORM, "nonfinite_grad_steps", schema.SPIKE_COUNT, schema.GRAD_SPIKE_COUNT, "max_attn_logit",
          "max_abs_h", "max_log_z", "max_update_ratio", "skipped_steps", "amp_scale", "spike_files")
_DETACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # trainers without a configured RunTotals


class RunTotals(L.Callback):
    """Maxima (``record_max``: non-finite values ignored), counts (``add``) and last values (``set``) of the run.
    Tensors stay on their device until ``values()`` reads them (no device sync per step)."""

    def __init__(self) -> None:
        self._maxima: dict[str, float | Tensor] = {}
        self._counts: dict[str, int | Tensor] = {}
        self._last: dict[str, Any] = {}

    @staticmethod
    def of(trainer: L.Trainer) -> RunTotals:
        """The trainer's RunTotals (configured in callbacks=stability); a trainer without one gets a detached
        instance, so measuring callbacks work alone (its totals are not checkpointed)."""
        found = next((c for c in trainer.callbacks if isinstance(c, RunTotals)), None)
        if found is None:
            found = _DETACHED.setdefault(trainer, RunTotals())
        return found

    def record_max(self, name: str, value: float | Tensor | None) -> None:
        if value is None:
            return
        if isinstance(value, Tensor):
            value = value.detach().float()
            value = torch.where(value.isfinite(), value, torch.full_like(value, -math.inf))
            current = self._maxima.get(name)
            if current is None:
                self._maxima[name] = value
            else:
                self._maxima[name] = torch.maximum(torch.as_tensor(current, device=value.device), value)
        elif math.isfinite(value):
            current = self._maxima.get(name)
            self._maxima[name] = value if current is None else max(current, value)

    def add(self, name: str, count: int | Tensor = 1) -> None:
        self._counts[name] = self._counts.get(name, 0) + count

    def set(self, name: str, value: Any) -> None:
        self._last[name] = value

    def get(self, name: str, default: Any = None) -> Any:
        """One total (reading only it: a last value costs no device sync)."""
        if name in self._last:
            return self._last[name]
        if name in self._counts:
            return int(self._counts[name])
        if name in self._maxima:
            value = float(self._maxima[name])
            return value if math.isfinite(value) else None
        return default

    def values(self) -> dict[str, Any]:
        """Every total as a plain number (a maximum no finite value reached is None)."""
        maxima = {k: float(v) for k, v in self._maxima.items()}
        out: dict[str, Any] = {k: v if math.isfinite(v) else None for k, v in maxima.items()}
        out.update({k: int(v) for k, v in self._counts.items()})
        out.update(self._last)
        return out

    def state_dict(self) -> dict[str, Any]:
        values = self.values()
        return {"maxima": {k: values[k] for k in self._maxima}, "counts": {k: values[k] for k in self._counts},
                "last": dict(self._last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._maxima = {k: v for k, v in state["maxima"].items() if v is not None}
        self._counts, self._last = dict(state["counts"]), dict(state["last"])
