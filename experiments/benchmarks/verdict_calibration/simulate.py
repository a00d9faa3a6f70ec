"""Simulated sweeps with known truth: the runs a comparison reads, and what is true of them.

A run's loss is, for arm a at learning rate lr and seed s,

    loss = BASE + effect(a) + curve(a, lr) + seed(s) + luck(a, lr, s)
    val  = loss + eval_noise,   test = loss + another eval_noise

the seed effect shared by every run of a seed (init and data order are drawn from the seed), the run's own luck in
both of its losses (so val and test luck correlate sd_run^2 / (sd_run^2 + sd_eval^2), 0.993 at the 0.035 / 0.003
of the lr-grid cells: minillm's held-out test split contains the val windows), the evaluation noises independent.
``shared_luck`` is the share of the luck's variance that every arm's run at the same (lr, seed) has in common
(common random numbers: the same seed draws the same data order at that lr). The curve is k(a) * log10(lr / 0.01)^2
(k 0.08 nats per decade^2 for the baseline, ``arm_curve`` for the arms: 0 is truly flat). With probability
fail(a, lr) the run diverges instead (no loss, status diverged).

The truth (``expected``) of an arm at an lr is its expected outcome there, a failure counted at ln V (what the
verdict reads). Which difference a word is judged against depends on the design (designs.py): each arm at its best
lr of the grid, or each arm at the lr the pilot chose. A word is false when it is ``better`` while the truth is
>= 0 (lower is better), ``worse`` while it is <= 0, or ``equivalent`` while |truth| >= margin; ``inconclusive`` is
never false.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

LN_V = math.log(88)  # the character vocabulary of the embedded corpus
BASE, UNIGRAM = 1.9, 3.3
GRIDS = {1: (1e-2,), 5: (1e-3, 3e-3, 1e-2, 3e-2, 1e-1),  # half a decade apart, the optimum in the middle
         7: (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)}
BASELINE_CURVE = 0.08  # nats per decade^2 away from the optimum at 1e-2
MARGIN, ALPHA = 0.02, 0.05
PILOT_SEED0 = 1000  # pilot seeds are 1000, 1001, ...: disjoint from the judged seeds 0, 1, ...


@dataclass(frozen=True)
class Scenario:
    """One kind of sweep (module docstring). ``effect`` is planted in the first ``effect_arms`` arms (in every run);
    ``survivor_effect`` only in their runs that train. ``fail_by_lr``: a failure probability per lr of the grid
    for every arm (lr failures), on top of ``fail_baseline`` / ``fail_arm``. ``stability``: the report also gives
    the stability words (only for arms identical to the baseline, whose every stability difference is 0).
    ``designs``: how the sweep is judged (designs.DESIGNS)."""

    key: str  # what --cells names
    name: str
    question: str
    arms: int = 1
    seeds: int = 8
    lrs: int = 1
    arm_curve: float = BASELINE_CURVE
    strata: int = 1
    effect: float = 0.0
    effect_arms: int = 0
    survivor_effect: float = 0.0
    fail_baseline: float = 0.0
    fail_arm: float = 0.0
    fail_by_lr: tuple[float, ...] = ()
    noise: str = "normal"  # normal | t3 (Student t, 3 degrees of freedom, scaled to the same sd)
    sd_seed: float = 0.05
    sd_run: float = 0.01
    sd_eval: float = 0.003
    shared_luck: float = 0.0
    stability: bool = False
    pilot_seeds: int = 3
    designs: tuple[str, ...] = ("default",)

    def __post_init__(self) -> None:
        if self.fail_by_lr and len(self.fail_by_lr) != self.lrs:
            raise ValueError(f"{self.name}: fail_by_lr has {len(self.fail_by_lr)} values; allowed: one per lr "
                             f"({self.lrs})")
        if self.stability and not self.identical():
            raise ValueError(f"{self.name}: stability needs arms identical to the baseline (their truth is 0)")

    def identical(self) -> bool:
        return (self.effect_arms == 0 or (self.effect == 0 and self.survivor_effect == 0)) and (
            self.arm_curve == BASELINE_CURVE and self.fail_arm == self.fail_baseline)

    @property
    def grid(self) -> tuple[float, ...]:
        return GRIDS[self.lrs]


def arm_name(arm: int) -> str:
    return "baseline" if arm == 0 else f"arm{arm}"


def _curve(scenario: Scenario, arm: int, lr: float) -> float:
    k = BASELINE_CURVE if arm == 0 else scenario.arm_curve
    return k * math.log10(lr / 1e-2) ** 2


def _fail(scenario: Scenario, arm: int, lr_index: int) -> float:
    own = scenario.fail_baseline if arm == 0 else scenario.fail_arm
    by_lr = scenario.fail_by_lr[lr_index] if scenario.fail_by_lr else 0.0
    return 1 - (1 - own) * (1 - by_lr)


def _planted(scenario: Scenario, arm: int) -> bool:
    return 0 < arm <= scenario.effect_arms


def expected(scenario: Scenario, arm: int, lr: float) -> float:
    """The arm's expected outcome at the lr: a failure at ln V, a run that trains at its expected loss."""
    fail = _fail(scenario, arm, scenario.grid.index(lr))
    planted = scenario.effect + scenario.survivor_effect if _planted(scenario, arm) else 0.0
    return fail * LN_V + (1 - fail) * (BASE + _curve(scenario, arm, lr) + planted)


def best_truths(scenario: Scenario) -> dict[str, float]:
    """arm name -> the true difference arm - baseline at each one's best lr of the grid."""
    best = [min(expected(scenario, a, lr) for lr in scenario.grid) for a in range(scenario.arms + 1)]
    return {arm_name(a): best[a] - best[0] for a in range(1, scenario.arms + 1)}


def chosen_truths(scenario: Scenario, lrs: dict[str, float]) -> dict[str, float]:
    """arm name -> the true difference arm - baseline at the lrs given per arm (the pilot's choice)."""
    base = expected(scenario, 0, lrs["baseline"])
    return {arm_name(a): expected(scenario, a, lrs[arm_name(a)]) - base for a in range(1, scenario.arms + 1)}


def _noise(rng: np.random.Generator, scenario: Scenario, sd: float, size: Any) -> np.ndarray:
    if scenario.noise == "t3":
        return rng.standard_t(3, size) * sd / math.sqrt(3.0)  # the t(3) variance is 3
    return rng.normal(0.0, sd, size)


def sweep(scenario: Scenario, rng: np.random.Generator, seeds: range | None = None) -> list[dict]:
    """One simulated sweep over every arm, lr and seed of ``seeds`` (the judged seeds 0 .. seeds - 1 by default):
    a summary dict per run, as RunSummary writes the fields the comparison reads."""
    seeds = range(scenario.seeds) if seeds is None else seeds
    n, grid, arms = len(seeds), scenario.grid, scenario.arms + 1
    runs = []
    for stratum in range(scenario.strata):
        seed_effect = _noise(rng, scenario, scenario.sd_seed, n)
        shared = _noise(rng, scenario, scenario.sd_run, (len(grid), n))
        own = _noise(rng, scenario, scenario.sd_run, (arms, len(grid), n))
        luck = math.sqrt(scenario.shared_luck) * shared + math.sqrt(1 - scenario.shared_luck) * own
        evals = _noise(rng, scenario, scenario.sd_eval, (2, arms, len(grid), n))
        draws = rng.random((arms, len(grid), n))
        for arm in range(arms):
            planted = scenario.effect + scenario.survivor_effect if _planted(scenario, arm) else 0.0
            for i, lr in enumerate(grid):
                failed = draws[arm, i] < _fail(scenario, arm, i)
                loss = BASE + _curve(scenario, arm, lr) + planted + seed_effect + luck[arm, i]
                for j, s in enumerate(seeds):
                    val, test = ((None, None) if failed[j] else
                                 (float(loss[j] + evals[0, arm, i, j]), float(loss[j] + evals[1, arm, i, j])))
                    runs.append({"norm": arm_name(arm), "placement": f"p{stratum}", "lr": lr, "seed": s,
                                 "loss_init": LN_V, "unigram_loss": UNIGRAM,
                                 "status": "diverged" if failed[j] else "completed", "final_val_loss": val,
                                 "best_val_loss": val, "test_loss": test, "diverged": bool(failed[j]),
                                 "failed": bool(failed[j])})
    return runs


def pilot_sweep(scenario: Scenario, rng: np.random.Generator) -> list[dict]:
    """The pilot of the two-stage design: every arm at every lr of the grid, on seeds disjoint from the judged."""
    return sweep(scenario, rng, range(PILOT_SEED0, PILOT_SEED0 + scenario.pilot_seeds))


def false_word(word: str, truth: float, margin: float = MARGIN) -> bool:
    return (word == "better" and truth >= 0) or (word == "worse" and truth <= 0) or (
        word == "equivalent" and abs(truth) >= margin)


def right_word(truth: float) -> str:
    """The word a decided comparison should say: equivalent inside the margin, else the side of the truth."""
    return "equivalent" if abs(truth) < MARGIN else ("worse" if truth > 0 else "better")


def as_dict(scenario: Scenario) -> dict[str, Any]:
    return asdict(scenario)
