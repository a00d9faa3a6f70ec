"""What a run's outcome is: defined once, for the summary callback, the report, the comparison engine and every
study's analysis (docs/definitions.md explains each).

    diverged  the divergence guard stopped the run (non-finite loss or weights, loss above its ceiling), or
              the final val loss is not finite, or it is >= ln V (the loss of a uniform prediction) after an
              earlier validation was below ln V: the loss blew up, or came back up
    not trained  not diverged, and the final val loss is still >= ln V with no validation ever below it:
              the run learned nothing (too few steps for a smoke test, or an lr at which it never started)
    failed    diverged, not trained, crashed, never validated, or a final val loss >= the unigram loss of the same
              evaluated windows (the train split's token frequencies scored on exactly the tokens val loss
              averages over) minus a margin; a run stopped by a signal and not resumed has no outcome yet
    stalled   not diverged, and a final val loss >= unigram loss - margin (a study fixes its margin first)

``loss_for_comparison`` is the loss studies and the report compare: the final val loss, with a diverged or
missing one counted as ln V (never better than predicting uniformly).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from minillm import schema

# --- the outcome ---------------------------------------------------------------------------------------------


def unigram_loss(train_counts: np.ndarray, target_counts: np.ndarray) -> float:
    """Cross entropy (nats/token) of targets with the token counts ``target_counts`` (V,) under the add-one
    smoothed frequencies ``train_counts`` (V,): what a model that ignores all context scores on those tokens."""
    train = np.asarray(train_counts, dtype=np.float64) + 1.0
    targets = np.asarray(target_counts, dtype=np.float64)
    return float(targets @ -np.log(train / train.sum()) / targets.sum())


def is_number(value: Any) -> bool:
    """A finite int or float read from summary.json (not a bool, not None, NaN or inf)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def numbers(values: Iterable[Any]) -> list[float]:
    """The finite numbers among ``values``, as floats."""
    return [float(v) for v in values if is_number(v)]


def is_diverged(guard_tripped: bool, final_val: float | None, loss_init: float | None,
                best_val: float | None = None) -> bool:
    """The guard stopped the run, or a final val loss that is not finite, or one >= ln V after a validation
    (``best_val``, the lowest) below ln V."""
    if guard_tripped:
        return True
    if final_val is None:
        return False  # never validated: failed, not diverged
    if not is_number(final_val):
        return True
    return loss_init is not None and final_val >= loss_init and is_number(best_val) and best_val < loss_init


def is_not_trained(diverged: bool, final_val: float | None, loss_init: float | None) -> bool:
    """Not diverged, and a final val loss still >= ln V (no validation was ever below it)."""
    return not diverged and is_number(final_val) and loss_init is not None and final_val >= loss_init


def is_failed(status: str, diverged: bool, final_val: float | None, unigram: float | None,
              margin: float = 0.0) -> bool | None:
    """Diverged, crashed, never validated, or final val loss >= unigram - margin; None while preempted."""
    if status == "preempted":
        return None
    if status == "failed" or diverged or not is_number(final_val):
        return True
    return unigram is not None and final_val >= unigram - margin


def is_stalled(summary: Mapping[str, Any], margin: float) -> bool:
    """Not diverged, and a final val loss within ``margin`` nats of the unigram loss (or above it)."""
    final, unigram = summary.get(schema.FINAL_VAL_LOSS), summary.get(schema.UNIGRAM_LOSS)
    return not summary.get("diverged") and is_number(final) and unigram is not None and final >= unigram - margin


def loss_for_comparison(summary: Mapping[str, Any], loss_init: float | None = None,
                        key: str = schema.FINAL_VAL_LOSS) -> float:
    """min(final val loss, ln V); a diverged run, or a missing or non-finite loss, counts as ln V. ``key`` names
    another loss of summary.json in nats (best_val_loss, test_loss) to take instead of the final val loss."""
    loss_init = loss_init if loss_init is not None else summary.get(schema.LOSS_INIT)
    loss_init = loss_init if loss_init is not None else math.inf
    value = summary.get(key)
    if summary.get("diverged") or not is_number(value):
        return loss_init
    return min(float(value), loss_init)


def failed_of(summary: Mapping[str, Any], margin: float = 0.0) -> bool:
    """is_failed on a run's summary.json; a run stopped by a signal and not resumed counts as not failed."""
    return bool(is_failed(summary.get("status"), bool(summary.get("diverged")), summary.get(schema.FINAL_VAL_LOSS),
                          summary.get(schema.UNIGRAM_LOSS), margin))


def final_loss(summary: Mapping[str, Any]) -> float | None:
    """The final val loss of a run that did not diverge; None for a diverged run or one without a finite one."""
    value = summary.get(schema.FINAL_VAL_LOSS)
    return None if summary.get("diverged") or not is_number(value) else float(value)
