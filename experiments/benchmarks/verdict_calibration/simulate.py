"""Simulated sweeps with known truth, judged by minillm.analysis.compare: how often each rule says a false word.

A run's loss is, for arm a at learning rate lr and seed s,

    loss = BASE + effect(a) + curve(a, lr) + seed_effect(s) + run_luck(a, lr, s)
    val  = loss + eval_noise,   test = loss + another eval_noise

the seed effect shared by every run of a seed (init and data order are drawn from the seed), the run's own luck in
both of its losses (what an lr chosen on the judging runs rewards), the evaluation noises independent. With
probability fail(a) the run diverges instead (no loss, status diverged). The truth of a comparison is the difference
of the two arms' expected outcomes at their own best lr of the grid, a failure counted at ln V (what the default
verdict estimates). A word is false when it is ``better`` while the truth is >= 0 (lower is better), ``worse`` while
it is <= 0, or ``equivalent`` while |truth| >= margin; ``inconclusive`` is never false. A report's family-wise error
is the chance that any of its words is false.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from minillm.analysis.compare import compare

LN_V = math.log(88)  # the character vocabulary of the embedded corpus
BASE, UNIGRAM = 1.9, 3.3
GRID = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)  # half a decade apart, the optimum in the middle
MARGIN, ALPHA = 0.02, 0.05


@dataclass(frozen=True)
class Scenario:
    """One kind of sweep. ``curve``: none (one lr), flat (the arms' loss-vs-lr curves differ in sharpness: the
    baseline's rises 0.08 nats per decade squared away from its optimum, every arm's 0.01, equal at the optimum).
    ``effect`` is planted in the first ``effect_arms`` arms; ``survivor_effect`` only in their runs that train."""

    name: str
    question: str
    arms: int = 1
    seeds: int = 8
    strata: int = 1
    curve: str = "none"
    effect: float = 0.0
    effect_arms: int = 0
    survivor_effect: float = 0.0
    fail_baseline: float = 0.0
    fail_arm: float = 0.0
    noise: str = "normal"  # normal | t3 (Student t, 3 degrees of freedom, scaled to the same sd)
    sd_seed: float = 0.05
    sd_run: float = 0.01
    sd_eval: float = 0.003
    rules: tuple[str, ...] = ("before", "default")


RULES: dict[str, dict[str, Any]] = {
    "before": {"metric": "final_val_loss", "lr_choice": "same", "failures": "drop", "adjust": "none",
               "equivalence": "interval"},  # the rules registered before 2026-11-28 (REGISTERED_BEFORE)
    "default": {},  # lr chosen on the validation loss, verdict on the test loss
    "same data": {"lr_choice": "same"},
    "cross-fit": {"lr_choice": "crossfit"},
    "no adjust": {"adjust": "none"},
}


def _curve(scenario: Scenario, arm: int, lr: float) -> float:
    if scenario.curve == "none":
        return 0.0
    k = 0.08 if arm == 0 else 0.01
    return k * math.log10(lr / 1e-2) ** 2


def _grid(scenario: Scenario) -> tuple[float, ...]:
    return (1e-2,) if scenario.curve == "none" else GRID


def truths(scenario: Scenario) -> dict[str, float]:
    """arm name -> the true difference arm - baseline of the expected outcome at each one's best lr."""
    def expected(arm: int) -> float:
        fail = scenario.fail_baseline if arm == 0 else scenario.fail_arm
        planted = arm > 0 and arm <= scenario.effect_arms
        best = min(_curve(scenario, arm, lr) for lr in _grid(scenario))
        trained = BASE + best + (scenario.effect + scenario.survivor_effect if planted else 0.0)
        return fail * LN_V + (1 - fail) * trained
    return {f"arm{a}": expected(a) - expected(0) for a in range(1, scenario.arms + 1)}


def _noise(rng: np.random.Generator, scenario: Scenario, sd: float, size: Any) -> np.ndarray:
    if scenario.noise == "t3":
        return rng.standard_t(3, size) * sd / math.sqrt(3.0)  # the t(3) variance is 3
    return rng.normal(0.0, sd, size)


def sweep(scenario: Scenario, rng: np.random.Generator) -> list[dict]:
    """One simulated sweep: a summary dict per run, as RunSummary writes the fields the comparison reads."""
    runs = []
    for stratum in range(scenario.strata):
        seed_effect = _noise(rng, scenario, scenario.sd_seed, scenario.seeds)
        for arm in range(scenario.arms + 1):
            fail = scenario.fail_baseline if arm == 0 else scenario.fail_arm
            planted = 0 < arm <= scenario.effect_arms
            for lr in _grid(scenario):
                luck = _noise(rng, scenario, scenario.sd_run, scenario.seeds)
                evals = _noise(rng, scenario, scenario.sd_eval, (2, scenario.seeds))
                failed = rng.random(scenario.seeds) < fail
                for s in range(scenario.seeds):
                    loss = (BASE + _curve(scenario, arm, lr) + seed_effect[s] + luck[s]
                            + (scenario.effect + scenario.survivor_effect if planted else 0.0))
                    val, test = (None, None) if failed[s] else (loss + evals[0, s], loss + evals[1, s])
                    runs.append({"norm": "baseline" if arm == 0 else f"arm{arm}", "placement": f"p{stratum}",
                                 "lr": lr, "seed": s, "loss_init": LN_V, "unigram_loss": UNIGRAM,
                                 "status": "diverged" if failed[s] else "completed", "final_val_loss": val,
                                 "best_val_loss": val, "test_loss": test, "diverged": bool(failed[s]),
                                 "failed": bool(failed[s])})
    return runs


def false_word(word: str, truth: float) -> bool:
    return (word == "better" and truth >= 0) or (word == "worse" and truth <= 0) or (
        word == "equivalent" and abs(truth) >= MARGIN)


def right_word(truth: float) -> str:
    """The word a decided comparison should say: equivalent inside the margin, else the side of the truth."""
    return "equivalent" if abs(truth) < MARGIN else ("worse" if truth > 0 else "better")


@dataclass
class Tally:
    """Counts over the replicate sweeps of one scenario under one rule."""

    reports: int = 0
    family_false: int = 0
    false_better: int = 0
    comparisons: int = 0
    covered: int = 0
    with_interval: int = 0
    planted: int = 0
    planted_right: int = 0
    decided: int = 0
    words: dict[str, int] = field(default_factory=dict)

    def add(self, result: Mapping, truth: Mapping[str, float], planted: set[str]) -> None:
        self.reports += 1
        wrong = False
        for c in result["comparisons"]:
            t = truth[c["arm"]]
            word = c["verdict"]
            self.comparisons += 1
            self.words[word] = self.words.get(word, 0) + 1
            wrong |= false_word(word, t)
            self.false_better += word == "better" and t >= 0
            self.decided += word != "inconclusive"
            if c["ci_low"] is not None:
                self.with_interval += 1
                self.covered += c["ci_low"] <= t <= c["ci_high"]
            if c["arm"] in planted:
                self.planted += 1
                self.planted_right += word == right_word(t)
        self.family_false += wrong

    def summary(self) -> dict[str, Any]:
        def rate(k: int, n: int) -> dict[str, float | int | None]:
            return {"rate": k / n if n else None, "mc_se": math.sqrt(k / n * (1 - k / n) / n) if n else None, "n": n}
        return {"family_false": rate(self.family_false, self.reports),
                "false_better": rate(self.false_better, self.reports),
                "coverage": rate(self.covered, self.with_interval),
                "power": rate(self.planted_right, self.planted),
                "decided": rate(self.decided, self.comparisons), "words": dict(sorted(self.words.items()))}


def replicate(scenario: Scenario, rule: str, reps: int, seed: int) -> dict[str, Any]:
    """The tally of ``reps`` sweeps of the scenario judged under the rule (the same sweeps for every rule)."""
    rng = np.random.default_rng(seed)
    truth = truths(scenario)
    planted = {f"arm{a}" for a in range(1, scenario.effect_arms + 1)}
    tally = Tally()
    for _ in range(reps):
        runs = sweep(scenario, rng)
        tally.add(compare(runs, "norm", "baseline", margin=MARGIN, alpha=ALPHA, **RULES[rule]), truth, planted)
    return {"scenario": scenario.name, "rule": rule, "truth": truth, **tally.summary()}


def plan_check(pilot_seeds: int, effect: float, reps: int, seed: int, sd_run: float = 0.01) -> dict[str, Any]:
    """seeds_needed as a plan: a pilot of ``pilot_seeds`` pairs with a planted effect that leaves it inconclusive;
    a new sweep of the size it names; how often that sweep decides (the plan promises 80%)."""
    rng = np.random.default_rng(seed)
    scenario = Scenario("plan", "", seeds=pilot_seeds, effect=effect, effect_arms=1, sd_run=sd_run)
    decided, asked = 0, []
    for _ in range(reps):
        pilot = compare(sweep(scenario, rng), "norm", "baseline", margin=MARGIN, alpha=ALPHA)["comparisons"][0]
        n = pilot["seeds_needed"]
        if pilot["verdict"] != "inconclusive" or n is None or n > 400:
            continue
        asked.append(n)
        fresh = compare(sweep(Scenario("fresh", "", seeds=n, effect=effect, effect_arms=1, sd_run=sd_run), rng),
                        "norm", "baseline", margin=MARGIN, alpha=ALPHA)["comparisons"][0]
        decided += fresh["verdict"] != "inconclusive"
    k = len(asked)
    return {"pilot_seeds": pilot_seeds, "effect": effect, "pilots_inconclusive": k,
            "median_seeds_needed": float(np.median(asked)) if asked else None,
            "decided": {"rate": decided / k if k else None,
                        "mc_se": math.sqrt(decided / k * (1 - decided / k) / k) if k else None, "n": k}}


def scenarios() -> Iterator[Scenario]:
    """The sweeps the committed results measure (README.md explains each group)."""
    for n in (3, 5, 8, 20):
        yield Scenario(f"null, 1 arm, {n} seeds", "no effect: any better / worse is false", seeds=n)
    for n in (3, 8):
        yield Scenario(f"null, 5 arms, {n} seeds", "five arms equal to the baseline", arms=5, seeds=n,
                       rules=("before", "no adjust", "default"))
    yield Scenario("null, 5 arms, 8 seeds, t(3) noise", "heavy-tailed seed and run noise", arms=5, noise="t3")
    yield Scenario("null, 2 strata x 3 arms, 8 seeds", "the family spans strata", arms=3, strata=2,
                   rules=("before", "no adjust", "default"))
    for n in (4, 8, 12):
        yield Scenario(f"flat lr curve, null, {n} seeds", "equal at the optimum, the arm's curve flatter", curve="flat",
                       seeds=n, sd_run=0.02, rules=("before", "same data", "cross-fit", "default"))
    yield Scenario("flat lr curve, null, 5 arms, 8 seeds", "five flatter arms, equal at the optimum", arms=5,
                   curve="flat", sd_run=0.02, rules=("before", "same data", "cross-fit", "default"))
    yield Scenario("failures equal, 8 seeds", "both arms fail 20% of runs", fail_baseline=0.2, fail_arm=0.2)
    yield Scenario("arm fails 3 of 8, survivors +0.1", "the arm fails more and trains worse", fail_arm=0.375,
                   survivor_effect=0.1, effect_arms=1)
    yield Scenario("arm fails 5 of 8, survivors -0.03", "the arm fails more, its survivors are better",
                   fail_arm=0.625, survivor_effect=-0.03, effect_arms=1)
    for n in (3, 5, 8):
        yield Scenario(f"effect +0.03, {n} seeds", "a planted difference beyond the margin", seeds=n, effect=0.03,
                       effect_arms=1)
    for n in (8, 20):
        yield Scenario(f"effect = margin, {n} seeds", "equivalent would be false", seeds=n, effect=MARGIN,
                       effect_arms=1)
    yield Scenario("no effect, 8 seeds (equivalence power)", "equivalent is the right word", effect_arms=1)


def as_dict(scenario: Scenario) -> dict[str, Any]:
    return asdict(scenario)
