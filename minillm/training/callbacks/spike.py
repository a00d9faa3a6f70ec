"""SpikeCapture (``callbacks.spike``): what a spike leaves behind to be explained and replayed.

With ``callbacks.spike.steps=K`` (0, the default, is off) a run keeps, for its last K steps, a ring buffer of
per-step statistics (StabilityMonitor measures every one of them, the attention probe included, and hands them
here) and a ring of cheap checkpoints (every ``checkpoint_every_n_steps`` steps, in memory or on disk, enough of
them that the oldest is at least K steps back). When a loss spike (StabilityMonitor's detector, counted in
RunTotals) or a divergence (DivergenceGuard's verdict in RunTotals) is found at step N, it writes, in ``dirpath``
(``<run>/spikes``):

    step_<N>.ckpt   the oldest ring checkpoint (at step A, N - K - every <= A <= N): minillm-replay starts from it
    step_<N>.json   kind, step, loss and its z-score, the batch of step N (global sample indices and the windows'
                    token offsets: the batches are a pure function of (seed, sample index)), every signal of the
                    last K steps, the lead-lag ranking (minillm.forensics) and the replay command
    step_<N>.md     the same as a report; step_<N>.png: the K steps before the spike, one line per signal

At most ``max_captures`` spikes per run are written (a divergence always is). summary.json lists the spike files
(``spike_files``). Single-process runs only: under DDP it says so once and stays off.
"""

from __future__ import annotations

import copy
import json
import logging
import shlex
from collections import deque
from pathlib import Path
from typing import Any

import lightning as L

from minillm import _compat, forensics, schema
from minillm.errors import check_bool, check_choice, check_int, check_number
from minillm.files import json_safe
from minillm.metrics import LOSS_SPIKE_SCORE, TRAIN_LOSS
from minillm.training.callbacks.common import Observer
from minillm.training.callbacks.run_totals import RunTotals

log = logging.getLogger("minillm")
STORES = ("memory", "disk")
RING = ".ring"  # the disk ring's folder inside dirpath


class SpikeCapture(Observer):
    """Keeps the last ``steps`` steps (statistics and checkpoints) and writes them when a spike or a divergence
    happens (module docstring)."""

    def __init__(self, dirpath: str, steps: int = 0, checkpoint_every_n_steps: int = 5, store: str = "memory",
                 attention: bool = True, max_captures: int = 5, onset_z: float = 5.0):
        check_int("callbacks.spike.steps", steps, low=0)
        check_int("callbacks.spike.checkpoint_every_n_steps", checkpoint_every_n_steps, low=1)
        check_choice("callbacks.spike.store", store, STORES)
        check_bool("callbacks.spike.attention", attention)
        check_int("callbacks.spike.max_captures", max_captures, low=1)
        check_number("callbacks.spike.onset_z", onset_z, low=0.0, low_open=True)
        self.dirpath, self.steps, self.every = Path(dirpath), steps, checkpoint_every_n_steps
        self.store, self.attention, self.max_captures, self.onset_z = store, attention, max_captures, onset_z
        self.rows: deque[tuple[int, dict[str, float]]] = deque(maxlen=steps + 1 if steps else 1)
        self.ring: deque[tuple[int, Any]] = deque()  # (step, checkpoint dict or file)
        self.written: list[str] = []
        self._on = False
        self._step = 0  # the step in progress (or just completed)
        self._seen: tuple[int, bool] | None = None  # (spike count, diverged) at the last check
        self._captured: set[int] = set()

    # --- what StabilityMonitor asks and gives ---------------------------------------------------------------

    def active(self, trainer: L.Trainer) -> bool:
        """On for this run: steps > 0 in a single process."""
        if self.steps and trainer.world_size > 1 and not getattr(self, "_warned", False):
            self._warned = True
            log.warning("callbacks.spike: spike capture runs in single-process runs only; it is off in this run "
                        f"of {trainer.world_size} processes")
        return bool(self.steps) and trainer.world_size == 1 and self.failure is None

    def wants(self, step: int) -> bool:
        return self._on and self.failure is None

    def record(self, step: int, metrics: dict[str, float]) -> None:
        if self._on:
            self.rows.append((step, dict(metrics)))

    # --- hooks ---------------------------------------------------------------------------------------------

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._on = self.active(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if not self._on:
            return
        self._check(trainer)  # what the previous step's hooks found (in whatever order they ran)
        step = trainer.global_step
        if self.ring and self.ring[-1][0] == step:  # a later micro-batch of the same step
            self._step = step
            return
        self._step = step
        if step % self.every == 0 or not self.ring:  # an empty ring: the first step of this fit (a resume too)
            self._snapshot(trainer, step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._on:
            self._check(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._on:
            self._check(trainer)
            if not self.written:  # say so: a capture that caught nothing leaves no file to look for
                log.info(f"callbacks.spike: no loss spike or divergence in this run; nothing written to "
                         f"{self.dirpath}")
        self._clear()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._clear()

    def release(self, pl_module: L.LightningModule | None) -> None:
        self._clear()

    # --- the rings -----------------------------------------------------------------------------------------

    def _snapshot(self, trainer: L.Trainer, step: int) -> None:
        """A resumable checkpoint of the state before ``step`` (as a checkpoint saved at the end of step - 1)."""
        ckpt = _compat.dump_checkpoint(trainer)
        _compat.as_saved_at_the_end_of_the_step(ckpt)
        if self.store == "memory":
            self.ring.append((step, copy.deepcopy(ckpt)))  # tensors cloned: training goes on changing them
        else:
            path = self.dirpath / RING / f"step-{step}.ckpt"
            trainer.strategy.checkpoint_io.save_checkpoint(ckpt, path)
            self.ring.append((step, path))
        while len(self.ring) > 1 and self.ring[1][0] <= step - self.steps:  # the oldest still covers K steps
            _, old = self.ring.popleft()
            if isinstance(old, Path):
                old.unlink(missing_ok=True)

    def _clear(self) -> None:
        for _, item in self.ring:
            if isinstance(item, Path):
                item.unlink(missing_ok=True)
        self.ring.clear()
        ring_dir = self.dirpath / RING
        if ring_dir.is_dir() and not any(ring_dir.iterdir()):
            ring_dir.rmdir()
            if self.dirpath.is_dir() and not any(self.dirpath.iterdir()):
                self.dirpath.rmdir()

    # --- finding and writing spikes ------------------------------------------------------------------------

    def _check(self, trainer: L.Trainer) -> None:
        totals = RunTotals.of(trainer)
        now = (int(totals.get(schema.SPIKE_COUNT, 0) or 0), bool(totals.get(schema.STOPPED_EARLY)))
        before, self._seen = self._seen, now
        if before is None:
            return
        if now[1] and not before[1]:
            step = totals.get(schema.DIVERGED_STEP)
            self._capture(trainer, self._step if step is None else int(step), "divergence",
                          totals.get("diverged_reason"))
        elif now[0] > before[0]:
            self._capture(trainer, self._step, "loss_spike", None)

    def _capture(self, trainer: L.Trainer, step: int, kind: str, reason: str | None) -> None:
        if step in self._captured or not self.ring:
            return
        if kind == "loss_spike" and len(self._captured) >= self.max_captures:
            if len(self._captured) == self.max_captures:
                log.info(f"callbacks.spike: {self.max_captures} spikes written (max_captures); later ones are not")
                self._captured.add(-1)
            return
        self._captured.add(step)
        start, ckpt = next(((s, c) for s, c in self.ring if s <= step), self.ring[0])
        self.dirpath.mkdir(parents=True, exist_ok=True)
        ckpt_path = self.dirpath / f"step_{step}.ckpt"
        if isinstance(ckpt, Path):
            ckpt_path.unlink(missing_ok=True)
            ckpt_path.hardlink_to(ckpt)  # the ring's file stays the ring's: both names, one file
        else:
            trainer.strategy.checkpoint_io.save_checkpoint(ckpt, ckpt_path)
        rows = [(s, m) for s, m in self.rows if s <= step]
        record = self._record(trainer, step, kind, reason, start, ckpt_path, rows)
        base = self.dirpath / f"step_{step}"
        tmp = base.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
        tmp.replace(base.with_suffix(".json"))
        base.with_suffix(".md").write_text(forensics.report(record))
        series = forensics.series_of(rows)
        forensics.plot(series, step, record["lead_lag"], base.with_suffix(".png"),
                       title=f"{kind.replace('_', ' ')} at step {step}: the {len(rows)} steps before it")
        self.written.append(str(base.with_suffix(".json")))
        RunTotals.of(trainer).set("spike_files", list(self.written))
        first = next((e for e in record["lead_lag"] if e["onset_step"] is not None), None)
        log.warning(f"{kind.replace('_', ' ')} at step {step}: wrote {base}.json (.md, .png) and {ckpt_path.name} "
                    f"(step {start}); first to move: {forensics.describe(first) if first else 'none'}; replay: "
                    f"{record['replay']}")

    def _record(self, trainer: L.Trainer, step: int, kind: str, reason: str | None, start: int, ckpt_path: Path,
                rows: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
        metrics = dict(rows[-1][1]) if rows and rows[-1][0] == step else {}
        series = forensics.series_of(rows)
        lead_lag = forensics.lead_lag(series, step, threshold=self.onset_z)
        per_step = self._samples_per_step(trainer)
        return json_safe({
            "kind": kind, "step": step, "reason": reason,
            "loss": metrics.get(TRAIN_LOSS), "loss_z": metrics.get(LOSS_SPIKE_SCORE),
            "checkpoint": {"path": ckpt_path.name, "step": start},  # beside this file: the run folder can move
            "replay": f"minillm-replay {shlex.quote(str(ckpt_path))} --steps {start}:{step + 1}",
            "batch": self._batch(trainer, step, per_step),
            "steps": [s for s, _ in rows],
            "samples_per_step": per_step,
            "lead_lag": lead_lag,
            "history": [{"step": s, **m} for s, m in rows],
        })

    @staticmethod
    def _samples_per_step(trainer: L.Trainer) -> int | None:
        batch = getattr(trainer.datamodule, "batch_size", None) if trainer.datamodule is not None else None
        if not isinstance(batch, int):
            return None
        return batch * int(trainer.accumulate_grad_batches or 1) * int(trainer.world_size or 1)

    @staticmethod
    def _batch(trainer: L.Trainer, step: int, per_step: int | None) -> dict[str, Any] | None:
        """Step ``step``'s global sample indices and the token offsets of their windows in the train split."""
        if per_step is None:
            return None
        first = step * per_step
        out: dict[str, Any] = {"samples": [first, first + per_step]}
        windows = getattr(trainer.datamodule, "train_set", None)
        if windows is not None and hasattr(windows, "n_starts"):
            from minillm.training.data.windows import window_starts

            indices = range(first, first + per_step)
            out["seed"] = int(windows.seed)
            out["window_starts"] = window_starts(windows.seed, list(indices), windows.n_starts).tolist()
            out["seq_len"] = int(windows.seq_len)
        return out
