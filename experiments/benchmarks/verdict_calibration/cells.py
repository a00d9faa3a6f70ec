"""The cells the committed results measure (README.md explains each group), and their simulated sweeps per run.

Lr-grid cells (``grid``): 7 lrs half a decade apart, run luck sd 0.035 (val-test correlation 0.993), half of its
variance shared by the arms at the same (lr, seed); the flat arm's curve is truly flat (0 nats per decade^2 against
the baseline's 0.08), equal to the baseline at its optimum. One-lr cells (``one lr``): the engine where no lr is
chosen (run luck sd 0.01), to show what holds there.
"""

from __future__ import annotations

from collections.abc import Iterator

from experiments.benchmarks.verdict_calibration.simulate import MARGIN, Scenario

GRID = {"lrs": 7, "sd_run": 0.035, "shared_luck": 0.5}
FLAT = {**GRID, "arm_curve": 0.0}
ALL = ("default", "two-stage", "selection-aware")
LR_FAILURES = (0.0, 0.0, 0.0, 0.0, 0.1, 0.4, 0.8)  # the top lrs diverge more often, the same in every arm


def cells() -> Iterator[tuple[Scenario, int]]:
    """(scenario, sweeps to simulate): 3,000 sweeps per cell (Monte Carlo se 0.4 points at a rate of 5%), 1,500 for
    the costlier multi-arm lr-grid cells and the t(3) cell (0.56 points); the cost is in README.md."""
    for n in (4, 8, 12):
        yield Scenario(f"flat-{n}", f"flat arm, null, 7 lrs, {n} seeds", "a truly flat arm equal to the baseline at "
                       "its optimum: any better / worse is false", seeds=n, designs=ALL, **FLAT), 3000
    yield Scenario("flat-8-shared", "flat arm, null, 7 lrs, 8 seeds, luck 90% shared", "the same with the arms' "
                   "luck at an (lr, seed) mostly in common", seeds=8, designs=ALL, **{**FLAT, "shared_luck": 0.9}), 3000
    yield Scenario("flat-5arms", "5 flat arms, null, 7 lrs, 8 seeds", "five truly flat arms equal at the optimum",
                   arms=5, designs=ALL, **FLAT), 1500
    for n in (8, 12):
        yield Scenario(f"flat-margin-{n}", f"flat arm worse by the margin, 7 lrs, {n} seeds", "equivalent is false",
                       seeds=n, effect=MARGIN, effect_arms=1, designs=ALL, **FLAT), 3000
    yield Scenario("flat-margin-12-shared", "flat arm worse by the margin, 7 lrs, 12 seeds, luck 90% shared",
                   "equivalent is false", seeds=12, effect=MARGIN, effect_arms=1, designs=ALL,
                   **{**FLAT, "shared_luck": 0.9}), 3000
    for n in (3, 5, 8):
        yield Scenario(f"stability-{n}", f"--stability, identical arms, lr failures, {n} seeds", "every loss and "
                       "stability better / worse is false", seeds=n, stability=True, fail_by_lr=LR_FAILURES,
                       **GRID), 3000
    yield Scenario("stability-3arms", "--stability, 3 identical arms, lr failures, 3 seeds", "the same with three "
                   "arms", arms=3, seeds=3, stability=True, fail_by_lr=LR_FAILURES, **GRID), 1500
    yield Scenario("null-3", "null, 1 arm, one lr, 3 seeds", "no effect, the fewest seeds a verdict reads",
                   seeds=3), 3000
    yield Scenario("null-5arms", "null, 5 arms, one lr, 8 seeds", "five arms equal to the baseline", arms=5), 3000
    yield Scenario("null-t3", "null, 5 arms, one lr, 8 seeds, t(3) noise", "heavy-tailed seed and run noise", arms=5,
                   noise="t3"), 1500
    yield Scenario("margin", "effect = margin, one lr, 8 seeds", "equivalent is false", effect=MARGIN,
                   effect_arms=1), 3000
    yield Scenario("fails-equal", "failures equal (20%), one lr, 8 seeds", "both arms fail as often: no word is right "
                   "but equivalent", fail_baseline=0.2, fail_arm=0.2), 3000
    yield Scenario("fails", "arm fails 5 of 8, survivors -0.03, one lr", "failed runs make an arm worse, never "
                   "better", fail_arm=0.625, survivor_effect=-0.03, effect_arms=1), 3000
