"""Stop signals over a whole run: SIGTERM (preemption, ``kill``, SLURM), SIGINT (Ctrl-C) and SIGUSR2 (a time-limit
warning), in every phase of a job.

While the training steps run, ``minillm.training.callbacks.PreemptionCheckpoint`` owns them: it stops at a step
boundary and
saves ``preempted.ckpt``. Outside the steps, ``StopSignals`` (installed by train.py for the whole job) acts by phase:

    set-up        checking the config, preparing the data, building the model and loggers: stop at once
                  (``Interrupted``); nothing was trained, and train.py undoes the start as it undoes a refused one
    fit, test     Lightning's set-up before the first step, the final sample, the end-of-fit writes and the held-out
                  test: stop at once, inside Lightning, whose exception hooks record the run as ``preempted``
                  (RunSummary) with a resumable checkpoint of the trained weights (PreemptionCheckpoint, or the last
                  checkpoint of the final step); a resume skips the trained steps and runs what was cut short
    final writes  after the test (the W&B run's end, the closing line): the writes finish first (a second Ctrl-C
                  aborts them); the run is complete

A process that started with a signal ignored (a background job's Ctrl-C) keeps ignoring it, and a SIGUSR2 handler
installed before (submitit's requeue) is left in place.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger("minillm")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
STOP_CODES = {128 + s for s in STOP_SIGNALS}  # the exit status of a run stopped by one: 143, 130, 140


class Interrupted(SIGTERMException):
    """A stop signal outside the training steps: Lightning's SIGTERMException (its hooks record a stopped run), with
    the exit status of a process ended by that signal."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def signal_of(code: Any) -> int | None:
    """The stop signal of an exit status 128 + signal (None for any other status)."""
    return code - 128 if isinstance(code, int) and code in STOP_CODES else None


class StopSignals:
    """The job's handlers of the stop signals (see the module docstring); ``phase`` is set by the job as it goes."""

    def __init__(self) -> None:
        self.phase = "set-up"
        self.deferred: int | None = None  # a signal that arrived during the final writes
        self._before: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in STOP_SIGNALS:
            current = signal.getsignal(signum)
            if current is signal.SIG_IGN or (signum == signal.SIGUSR2 and callable(current)):
                continue
            self._before[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)
        self._before = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.phase != "final writes":
            raise Interrupted(signum)
        if self.deferred is None:
            log.warning(f"{signal.Signals(signum).name}: the run is complete; finishing its final writes first")
        self.deferred = self.deferred or signum
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts at once
