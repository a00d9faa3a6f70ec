"""How a simulated sweep is judged (a design), what its words are judged against, and the tally of many sweeps.

    default          minillm-report --compare on the whole sweep: each arm's lr chosen by the engine's default
                     (on the val loss of the judged seeds, the verdict on their test loss); judged against each
                     arm at its best lr of the grid.
    two-stage        a pilot (3 seeds disjoint from the judged ones, every lr) chooses each arm's lr on its val
                     loss (minillm.analysis.lr_choice.loss_by_lr, a failure at ln V); the judged seeds are then
                     compared at those lrs only (one lr per arm: nothing is chosen inside the comparison); judged
                     against each arm at the lr the pilot chose (the design's estimand). ``false_vs_best`` also
                     judges its words against the best lrs.
    selection-aware  the whole sweep with ``--lr-choice selection-aware`` (a claim about each arm's best lr);
                     judged against the best lrs. Skipped, with a note, where the Rules do not know the option.

With ``stability`` the report's stability words (every (arm, measure)) join its loss words; the cell's arms are
identical to the baseline, so a stability better / worse is false and equivalent is right.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from experiments.benchmarks.verdict_calibration import simulate as sim
from minillm.analysis import rules as rules_module
from minillm.analysis.compare import compare
from minillm.analysis.lr_choice import loss_by_lr
from minillm.analysis.runs import group_runs

DESIGNS = ("default", "two-stage", "selection-aware")
EXPLORATORY = "exploratory"  # a comparison's flag: its word is outside the report's alpha promise
SELECTION_AWARE = "selection-aware"


def skipped(design: str) -> str | None:
    """Why the design cannot run on these Rules, or None."""
    if design == "selection-aware" and SELECTION_AWARE not in rules_module.LR_CHOICES:
        allowed = ", ".join(rules_module.LR_CHOICES)
        return f"--lr-choice {SELECTION_AWARE} is not known to these Rules (allowed: {allowed})"
    return None


def _judge(runs: list[dict], scenario: sim.Scenario, **rules: Any) -> dict:
    return compare(runs, "norm", "baseline", margin=sim.MARGIN, alpha=sim.ALPHA, stability=scenario.stability,
                   **rules)


def pilot_lrs(pilot: list[dict]) -> dict[tuple[str, str], float]:
    """(stratum, arm) -> the lr of the grid with the lowest mean val loss over the pilot's seeds."""
    chosen = {}
    for (stratum, arm), rs in group_runs(pilot, ["placement", "norm"]).items():
        by_lr = loss_by_lr(rs, "final_val_loss")
        chosen[(stratum, arm)] = min(by_lr, key=by_lr.__getitem__)
    return chosen


def judged(scenario: sim.Scenario, design: str, runs: list[dict], pilot: list[dict] | None) -> \
        tuple[dict, dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """The design's report on one sweep, its truth per (arm, stratum) and the best-lr truth per (arm, stratum)."""
    best = {(arm, f"p{k}"): t for arm, t in sim.best_truths(scenario).items() for k in range(scenario.strata)}
    if design == "default":
        return _judge(runs, scenario), best, best
    if design == SELECTION_AWARE:
        return _judge(runs, scenario, lr_choice=SELECTION_AWARE), best, best
    if design != "two-stage":
        raise ValueError(f"design {design!r}; allowed: {', '.join(DESIGNS)}")
    chosen = pilot_lrs(pilot)
    truth = {}
    for k in range(scenario.strata):
        lrs = {arm: lr for (stratum, arm), lr in chosen.items() if stratum == f"p{k}"}
        truth.update({(arm, f"p{k}"): t for arm, t in sim.chosen_truths(scenario, lrs).items()})
    fixed = [r for r in runs if r["lr"] == chosen[(r["placement"], r["norm"])]]
    report = _judge(fixed, scenario)
    best_lr = min(scenario.grid, key=lambda lr: sim.expected(scenario, 0, lr))
    report["pilot_baseline_off_best"] = any(lr != best_lr for (_, arm), lr in chosen.items() if arm == "baseline")
    return report, truth, best


@dataclass
class Tally:
    """Counts over the replicate sweeps of one scenario under one design."""

    reports: int = 0
    family_false: int = 0  # any false word of the report: loss and stability words together
    promised_false: int = 0  # the same, leaving out the words the report labels exploratory
    loss_false: int = 0
    stability_false: int = 0
    false_better: int = 0
    false_equivalent: int = 0
    false_vs_best: int = 0  # any false loss word, judged against the best lrs
    comparisons: int = 0
    covered: int = 0
    with_interval: int = 0
    planted: int = 0
    planted_right: int = 0
    decided: int = 0
    exploratory: int = 0
    pilot_off_best: int = 0  # two-stage: sweeps whose pilot chose a baseline lr other than its best
    bias: float = 0.0
    words: dict[str, int] = field(default_factory=dict)
    stability_words: dict[str, int] = field(default_factory=dict)

    def add(self, result: Mapping, truth: Mapping, best: Mapping, planted: set[str]) -> None:
        self.reports += 1
        self.pilot_off_best += bool(result.get("pilot_baseline_off_best"))
        wrong = against_best = better = equivalent = promised = False
        for c in result["comparisons"]:
            key = (c["arm"], (c["stratum"] or {}).get("placement", "p0"))
            t, word = truth[key], c["verdict"]
            self.comparisons += 1
            self.words[word] = self.words.get(word, 0) + 1
            wrong |= sim.false_word(word, t)
            promised |= sim.false_word(word, t) and not c.get(EXPLORATORY)
            better |= word == "better" and t >= 0
            equivalent |= word == "equivalent" and abs(t) >= sim.MARGIN
            against_best |= sim.false_word(word, best[key])
            self.decided += word != "inconclusive"
            self.exploratory += bool(c.get(EXPLORATORY))
            self.bias += c["diff"] - t
            if c["ci_low"] is not None:
                self.with_interval += 1
                self.covered += c["ci_low"] <= t <= c["ci_high"]
            if c["arm"] in planted:
                self.planted += 1
                self.planted_right += word == sim.right_word(t)
        unstable = False
        for c in result.get("stability_verdict", {}).get("comparisons", []):
            for entry in c["measures"].values():
                word = entry["verdict"]
                self.stability_words[word] = self.stability_words.get(word, 0) + 1
                unstable |= word in ("better", "worse")  # identical arms: every stability difference is 0
        self.loss_false += wrong
        self.stability_false += unstable
        self.family_false += wrong or unstable
        self.promised_false += promised or unstable
        self.false_better += better
        self.false_equivalent += equivalent
        self.false_vs_best += against_best

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: rate(getattr(self, k), self.reports) for k in (
            "family_false", "promised_false", "loss_false", "stability_false", "false_better", "false_equivalent",
            "false_vs_best", "pilot_off_best")}
        out.update(coverage=rate(self.covered, self.with_interval), power=rate(self.planted_right, self.planted),
                   decided=rate(self.decided, self.comparisons),
                   bias=self.bias / self.comparisons if self.comparisons else None,
                   exploratory=self.exploratory, words=dict(sorted(self.words.items())),
                   stability_words=dict(sorted(self.stability_words.items())))
        return out


def rate(k: int, n: int) -> dict[str, Any]:
    """k of n with its Monte Carlo standard error and 95% Wilson interval."""
    if not n:
        return {"rate": None, "mc_se": None, "low": None, "high": None, "k": k, "n": n}
    p, z = k / n, 1.959964
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (
        1 + z * z / n)
    return {"rate": p, "mc_se": math.sqrt(p * (1 - p) / n), "low": max(0.0, centre - half),
            "high": min(1.0, centre + half), "k": k, "n": n}


def replicate(scenario: sim.Scenario, reps: int, seed: int, designs: tuple[str, ...] | None = None) -> list[dict]:
    """One cell per design: ``reps`` sweeps of the scenario, the same sweeps judged under every design (a design
    the Rules cannot run is returned with its note and no counts)."""
    designs = scenario.designs if designs is None else designs
    rng = np.random.default_rng(seed)
    planted = {sim.arm_name(a) for a in range(1, scenario.effect_arms + 1)}
    running = [d for d in designs if skipped(d) is None]
    tallies = {d: Tally() for d in running}
    for _ in range(reps):
        runs = sim.sweep(scenario, rng)
        pilot = sim.pilot_sweep(scenario, rng) if "two-stage" in running else None
        for design in running:
            tallies[design].add(*judged(scenario, design, runs, pilot), planted)
    return [{"cell": scenario.key, "scenario": scenario.name, "design": d, "question": scenario.question,
             "sims": reps if d in tallies else 0,
             **({"skipped": skipped(d)} if d not in tallies else tallies[d].summary())} for d in designs]
