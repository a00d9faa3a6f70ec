"""The outcome rules (minillm/outcome.py) every summary, report and study uses: diverged, not trained, failed,
stalled, and the loss a comparison takes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minillm.outcome import (
    failed_of,
    final_loss,
    is_diverged,
    is_failed,
    is_not_trained,
    is_stalled,
    loss_for_comparison,
    unigram_loss,
)

LN_V = math.log(88)


@pytest.mark.parametrize("tripped, final, best, diverged", [
    (True, 1.5, 1.5, True),  # the guard stopped it, whatever the loss
    (False, None, None, False),  # never validated: failed, not diverged
    (False, float("nan"), 2.0, True),  # a non-finite final loss
    (False, LN_V + 0.1, 2.0, True),  # came back up above ln V after learning
    (False, LN_V + 0.1, LN_V + 0.1, False),  # never below ln V: not trained, not diverged
    (False, 2.0, 1.9, False),
])
def test_diverged(tripped, final, best, diverged):
    assert is_diverged(tripped, final, LN_V, best) is diverged


def test_a_run_that_never_got_below_ln_v_is_not_trained_and_failed():
    final = LN_V + 0.01
    assert is_not_trained(False, final, LN_V) and not is_not_trained(True, final, LN_V)
    assert not is_not_trained(False, 2.0, LN_V)
    assert is_failed("completed", False, final, unigram=3.2)  # above the unigram loss


@pytest.mark.parametrize("status, diverged, final, unigram, margin, failed", [
    ("preempted", False, 2.0, 3.0, 0.0, None),  # no outcome yet
    ("failed", False, 2.0, 3.0, 0.0, True),  # crashed
    ("completed", True, 2.0, 3.0, 0.0, True),
    ("completed", False, None, 3.0, 0.0, True),  # never validated
    ("completed", False, 3.05, 3.0, 0.0, True),  # no better than ignoring the context
    ("completed", False, 2.95, 3.0, 0.1, True),  # within the margin of it
    ("completed", False, 2.0, 3.0, 0.1, False),
])
def test_failed(status, diverged, final, unigram, margin, failed):
    assert is_failed(status, diverged, final, unigram, margin) is failed


def test_stalled_and_failed_of_read_a_summary():
    summary = {"status": "completed", "diverged": False, "final_val_loss": 3.1, "unigram_loss": 3.2,
               "loss_init": LN_V}
    assert is_stalled(summary, margin=0.2) and not is_stalled(summary, margin=0.05)
    assert failed_of(summary, margin=0.2) and not failed_of(summary)
    assert not failed_of({**summary, "status": "preempted"})


def test_the_comparison_loss_is_never_worse_than_a_uniform_guess():
    base = {"final_val_loss": 2.0, "loss_init": LN_V, "diverged": False}
    assert loss_for_comparison(base) == 2.0 and final_loss(base) == 2.0
    assert loss_for_comparison({**base, "diverged": True}) == LN_V and final_loss({**base, "diverged": True}) is None
    assert loss_for_comparison({**base, "final_val_loss": None}) == LN_V
    assert loss_for_comparison({**base, "final_val_loss": 9.0}) == LN_V  # clipped at ln V
    assert loss_for_comparison({**base, "best_val_loss": 1.9}, key="best_val_loss") == 1.9


def test_unigram_loss_is_the_targets_cross_entropy_under_add_one_frequencies():
    train, targets = np.array([3, 1, 0]), np.array([2, 2, 1])
    p = (train + 1) / (train + 1).sum()  # [4, 2, 1] / 7
    expected = -(2 * math.log(p[0]) + 2 * math.log(p[1]) + math.log(p[2])) / 5
    assert unigram_loss(train, targets) == pytest.approx(expected)
