"""PreemptionCheckpoint: SIGTERM or a first Ctrl-C saves a resumable checkpoint after the current step."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger("minillm")



class PreemptionCheckpoint(L.Callback):
    """On SIGTERM (preemption, ``kill``, SLURM, Kubernetes) or a first Ctrl-C, save a resumable checkpoint.

    Lightning's signal connector turns SIGTERM into a flag that its loops check after each training step,
    raising ``SIGTERMException`` there; this callback saves ``<dirpath>/<filename>.ckpt`` in ``on_exception``
    and sets the exit status to 128 + signal. During training it puts itself in front of Lightning's handler:
    a first Ctrl-C counts as SIGTERM (a second one aborts at once, saving nothing), and a signal that arrives
    during a validation is held until the validation ends; a process started with SIGINT ignored keeps ignoring
    it. Other exceptions save nothing: a step cut short leaves no consistent state; use the last periodic
    checkpoint. The file is never removed automatically.
    (Not Lightning's OnExceptionCheckpoint: with one of those, ``fit(ckpt_path=None)`` silently resumes from
    the newest checkpoint in its directory.)
    """

    def __init__(self, dirpath: str | os.PathLike, filename: str = "preempted", handle_sigint: bool = True):
        self.ckpt_path = os.path.join(dirpath, f"{filename}.ckpt")
        self.handle_sigint = handle_sigint
        self.signum: int | None = None  # the signal that stopped training
        self._saved_handlers: dict[int, Any] = {}
        self._trainer: L.Trainer | None = None
        self._held = False
        self._validated_at = -1
        self._saving = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signum, self._held, self._trainer, self._validated_at = None, False, trainer, -1
        if os.name != "posix" or threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT) if self.handle_sigint else (signal.SIGTERM,):
            if signum == signal.SIGINT and signal.getsignal(signum) is signal.SIG_IGN:
                continue  # started with Ctrl-C ignored (a background job of a script, nohup-like): keep it so
            self._saved_handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            self._restore(signal.SIGINT)  # a second Ctrl-C raises KeyboardInterrupt as usual
            log.warning("Ctrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to abort)")
        self.signum = self.signum or signum
        if self._trainer is not None and self._trainer.validating:
            self._held = True  # passed on in on_validation_end
        else:
            self._notify_lightning(frame)

    def _notify_lightning(self, frame: Any = None) -> None:
        handler = self._saved_handlers.get(signal.SIGTERM, signal.getsignal(signal.SIGTERM))
        if callable(handler) and handler is not self._on_signal:
            handler(signal.SIGTERM, frame)  # Lightning's: sets trainer.received_sigterm

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validated_at = trainer.global_step
        if self._held:
            self._held = False
            self._notify_lightning()

    def _restore(self, *signums: int) -> None:
        for signum in signums or list(self._saved_handlers):
            handler = self._saved_handlers.pop(signum, None)
            if handler is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signum, handler)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        self._restore()
        if not isinstance(exception, SIGTERMException):
            return
        self._saving = True
        try:
            trainer.save_checkpoint(self.ckpt_path)
        finally:
            self._saving = False
        signum = self.signum or signal.SIGTERM
        if trainer.is_global_zero:
            log.warning(f"{signal.Signals(signum).name}: stopped at step {trainer.global_step} and saved "
                        f"{self.ckpt_path}; resume with the same command plus ckpt_path={self.ckpt_path}")
        exception.code = 128 + int(signum)  # the exit status of a process ended by this signal

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Stopped after a validation at this step: Lightning resumes such a checkpoint as one saved at the end
        # of that validation (as ModelCheckpoint saves), re-running the rest of the step, which counts the
        # step for the loggers a second time. Store the count as of the validation's end.
        if self._saving and self._validated_at == trainer.global_step:
            state = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
            if "_batches_that_stepped" in state:  # (Lightning 2.6 layout; the resume tests check it)
                state["_batches_that_stepped"] -= 1
