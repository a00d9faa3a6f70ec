"""Every use of a library's private API, in one place, each with a test in tests/test_compat.py that fails
loudly when the library changes (instead of a guard that would turn an upgrade into a silent no-op).

Lightning is pinned to a tested range in pyproject.toml; these are what an upgrade must re-check.
"""

from __future__ import annotations

import lightning as L


def validation_due(trainer: L.Trainer) -> bool:
    """Whether Lightning will run a validation after the training batch that just ended (its own rule:
    ``_should_check_val_fx``, which also covers epoch ends, time intervals and early stops)."""
    return bool(trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


def request_stop(trainer: L.Trainer) -> None:
    """Set the flag Lightning's SIGTERM handler sets: its loops stop after the current step (raising
    SIGTERMException). Set directly, because another library may own the SIGTERM handler (submitit does)."""
    trainer._signal_connector.received_sigterm = True


def count_logged_steps_as_of_validation_end(checkpoint: dict) -> None:
    """A checkpoint saved after a validation at the current step resumes like one ModelCheckpoint saved at the
    end of that validation: Lightning re-runs the rest of the step and counts it for the loggers a second time.
    Store the logger step count as of the validation's end (Lightning 2.6 layout)."""
    state = checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]
    state["_batches_that_stepped"] -= 1
