"""PreemptionCheckpoint: SIGTERM, SIGUSR2 or a first Ctrl-C saves a resumable checkpoint at a step boundary."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from minillm import _compat
from minillm.errors import check_bool
from minillm.training.run.signals import signal_of

log = logging.getLogger("minillm")


class PreemptionCheckpoint(L.Callback):
    """On SIGTERM (preemption, ``kill``, SLURM, Kubernetes), SIGUSR2 (submitit's and some clusters' warning
    before a time limit) or a first Ctrl-C, stop at the next step boundary and save a resumable checkpoint.

    A single process decides when the signal arrives; several (DDP) record it and decide together after each
    training step (one all-reduce), so all stop after the same step. The stop comes after the current step, or,
    when Lightning validates at that step, after the validation: a validation is never cut short, so the
    resumed run sees the same validations as an uninterrupted one. The stop raises Lightning's
    ``SIGTERMException``; this callback then saves ``<dirpath>/<filename>.ckpt`` in ``on_exception`` and sets
    the exit status to 128 + signal. For SIGUSR2, the handler that was installed before (submitit's, which
    requeues the job) runs after the save. A second Ctrl-C aborts at once, saving nothing; a process started
    with SIGINT ignored keeps ignoring it. Other exceptions save nothing (a step cut short is not a consistent
    state). The file is never removed automatically. Outside the steps (Lightning's set-up, the final sample, the
    held-out test) train.py's handlers stop the run at once (minillm.training.run.signals); the stop is saved here too,
    while
    the module holds the trained weights (not in a test of best.ckpt). train.py's closing line says how to resume.
    (Not Lightning's OnExceptionCheckpoint: with one of those, ``fit(ckpt_path=None)`` silently resumes from
    the newest checkpoint in its directory.)
    """

    def __init__(self, dirpath: str | os.PathLike, filename: str = "preempted", handle_sigint: bool = True):
        check_bool("callbacks.preemption.handle_sigint", handle_sigint)
        self.ckpt_path = os.path.join(dirpath, f"{filename}.ckpt")
        self.handle_sigint = handle_sigint
        self.signum: int | None = None  # the signal that stopped (or will stop) training
        self._saved_handlers: dict[int, Any] = {}
        self._trainer: L.Trainer | None = None
        self._requested = False  # Lightning's stop flag is set: it stops when the current step ends
        self._after_validation = False  # stop when the coming (or running) validation ends
        self._validated_at = -1
        self._saving = False
        self._save_point = "step end"  # where the save happens: "validation end" / "next step" in forked processes
        self._stop_at_next_step = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signum, self._trainer, self._validated_at = None, trainer, -1
        self._requested = self._after_validation = self._stop_at_next_step = False
        if os.name != "posix" or threading.current_thread() is not threading.main_thread():
            return
        signums = [signal.SIGTERM, signal.SIGUSR2] + ([signal.SIGINT] if self.handle_sigint else [])
        for signum in signums:
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue  # e.g. Ctrl-C ignored in a background job of a script (nohup-like): keep it so
            self._saved_handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            self._restore(signal.SIGINT)  # a second Ctrl-C raises KeyboardInterrupt as usual
            log.warning("Ctrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to abort)")
        self.signum = self.signum or signum
        if self._trainer is not None and self._trainer.world_size == 1:
            self._stop_at_next_boundary(self._trainer)  # several processes decide together, after a step

    def _stop_at_next_boundary(self, trainer: L.Trainer) -> None:
        """Stop after the current step, or after the validation that runs (or will run) at this step; once this
        step's validation has ended here (later callbacks may still be in their on_validation_end, and Lightning
        still reports it due until the next batch), at the next step boundary."""
        if self._requested or self._after_validation:
            return
        validated = self._validated_at == trainer.global_step
        if not validated and (trainer.validating or _compat.validation_due(trainer)):
            self._after_validation = True
        else:
            self._stop(trainer, after_validation=False)

    def _stop(self, trainer: L.Trainer, after_validation: bool) -> None:
        """Lightning stops when the step ends (raising SIGTERMException) and on_exception saves. A process of
        Lightning's fork/spawn launcher handles no exception, so there the stop happens in a hook: at the end of
        the validation, or at the start of the next step (the step that just ended then has its metrics
        logged); the exception hooks run first (this callback saves a checkpoint of the state at that hook, as
        ModelCheckpoint would), and the process ends with 128 + signal, which minillm.training.train reports."""
        self._requested = True
        if not _compat.in_forked_worker(trainer):
            _compat.request_stop(trainer)
        elif after_validation:
            self._stop_forked_worker(trainer)
        else:
            self._stop_at_next_step = True

    def _stop_forked_worker(self, trainer: L.Trainer) -> None:
        exception = SIGTERMException(128 + int(self.signum or signal.SIGTERM))
        self._save_point = "next step" if self._stop_at_next_step else "validation end"
        _compat.interrupt(trainer, exception)
        raise exception

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._stop_at_next_step:
            self._stop_forked_worker(trainer)

    def _any_process_signalled(self, trainer: L.Trainer) -> bool:
        pending = self.signum is not None
        if trainer.world_size > 1:
            pending = trainer.strategy.reduce_boolean_decision(pending, all=False)
        if pending:
            self.signum = self.signum or signal.SIGTERM  # a process without a signal follows the others
        return pending

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not (self._requested or self._after_validation) and self._any_process_signalled(trainer):
            self._stop_at_next_boundary(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self._validated_at = trainer.global_step
        if self._requested:
            return
        if self._after_validation or self._any_process_signalled(trainer):
            self._after_validation = False
            self._stop(trainer, after_validation=True)

    def _restore(self, *signums: int) -> None:
        for signum in signums or list(self._saved_handlers):
            handler = self._saved_handlers.pop(signum, None)
            if handler is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signum, handler)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        previous = dict(self._saved_handlers)
        self._restore()
        if not isinstance(exception, SIGTERMException):
            return
        signum = signal_of(exception.code) or self.signum or signal.SIGTERM  # a stop outside the steps has its own
        if self._holds_trained_weights(trainer):
            self._saving = True
            try:
                trainer.save_checkpoint(self.ckpt_path)
            finally:
                self._saving = False
            if trainer.is_global_zero:
                log.warning(f"{signal.Signals(signum).name}: stopped at step {trainer.global_step} and saved "
                            f"{self.ckpt_path}")
        exception.code = 128 + int(signum)  # the exit status of a process ended by this signal
        handler = previous.get(signum)
        if signum == signal.SIGUSR2 and callable(handler):
            handler(signum, None)  # e.g. submitit: requeue the job, then exit

    @staticmethod
    def _holds_trained_weights(trainer: L.Trainer) -> bool:
        """The module holds the run's trained state: in the fit, or in the held-out test of the final weights (not a
        test of best.ckpt or of an evaluated checkpoint, which loaded other weights)."""
        fn = trainer.state.fn
        final_weights_tested = fn == TrainerFn.TESTING and not trainer.ckpt_path and trainer.global_step > 0
        return fn == TrainerFn.FITTING or final_weights_tested

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if not self._saving:
            return
        if self._save_point == "next step":
            _compat.as_saved_at_the_end_of_the_step(checkpoint)
