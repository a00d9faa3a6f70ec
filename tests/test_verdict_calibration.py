"""The comparison engine measured on simulated sweeps (experiments/benchmarks/verdict_calibration): a small fixed-seed
version of the committed calibration. It fails when the family-wise rate of a false better / worse / equivalent
exceeds alpha by more than twice its Monte Carlo standard error, on the two sweeps where the rules before failed:
five arms equal to the baseline, and five arms equal at their optimum but with flatter loss-vs-lr curves."""

from __future__ import annotations

import math

import pytest

from experiments.benchmarks.verdict_calibration import simulate as sim

REPS = 80  # a bound of alpha + 0.049; the committed run has 1,000 sweeps per cell


@pytest.mark.parametrize("name", ["null, 5 arms, 8 seeds", "flat lr curve, null, 5 arms, 8 seeds"])
def test_the_default_rules_keep_the_family_wise_error_at_alpha(name):
    scenario = next(s for s in sim.scenarios() if s.name == name)
    cell = sim.replicate(scenario, "default", REPS, seed=11)
    bound = sim.ALPHA + 2 * math.sqrt(sim.ALPHA * (1 - sim.ALPHA) / REPS)
    assert cell["family_false"]["n"] == REPS and cell["family_false"]["rate"] <= bound, cell


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_the_rules_before_break_the_bound_on_the_same_sweeps():
    """The guard can fail: the unadjusted words of the rules before exceed it on the flat five-arm sweep."""
    scenario = next(s for s in sim.scenarios() if s.name == "flat lr curve, null, 5 arms, 8 seeds")
    cell = sim.replicate(scenario, "before", 60, seed=11)
    assert cell["family_false"]["rate"] > sim.ALPHA + 2 * math.sqrt(sim.ALPHA * (1 - sim.ALPHA) / 60)


def test_the_truth_and_the_words_of_the_simulation():
    """A failure counts at ln V in the truth; equivalent is false at the margin itself; inconclusive never is."""
    fails = next(s for s in sim.scenarios() if s.name.startswith("arm fails 5 of 8"))
    truth = sim.truths(fails)["arm1"]
    assert truth == pytest.approx(0.625 * sim.LN_V + 0.375 * (sim.BASE - 0.03) - sim.BASE)
    assert sim.false_word("better", truth) and not sim.false_word("worse", truth)
    assert sim.false_word("equivalent", sim.MARGIN) and not sim.false_word("equivalent", 0.019)
    assert not sim.false_word("inconclusive", 5.0) and sim.right_word(0.0) == "equivalent"
    flat = next(s for s in sim.scenarios() if s.name == "flat lr curve, null, 8 seeds")
    assert sim.truths(flat) == {"arm1": 0.0}  # equal at their optimum, whatever the curves' sharpness
