"""The rules of a comparison, in one place: their defaults, their check (naming the command-line option at fault)
and the rules minillm's earlier studies were registered with. Used by the engine (minillm.analysis.compare), the plan
(minillm.analysis.plans) and the command line (minillm.analysis.verdict_cli); docs/comparing.md explains each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from minillm import schema
from minillm.outcome import failed_of, is_number

LOSSES = (schema.FINAL_VAL_LOSS, schema.BEST_VAL_LOSS, schema.TEST_LOSS)  # losses in nats, with ln V as their ceiling
AUTO_METRIC = "auto"  # test_loss where every compared run that trained has one, else final_val_loss
CHOICE_METRIC = schema.FINAL_VAL_LOSS  # what an lr is chosen on when the verdict reads the held-out test loss
LR_RULES = ("tuned", "common")  # or a learning rate
LR_CHOICES = ("auto", "crossfit", "validation", "same", "selection-aware")
FAILURES = ("penalize", "drop")
ADJUSTS = ("holm", "none")
EQUIVALENCE = ("tost", "interval")
PAIRED_BY = ("auto", "seed", "none")
INTERVALS = ("t", "bootstrap")
# The engine's current rules: version 4, as of 2026-12-02 (a change to any word or number it gives is version 5);
# 3: the same but for the stability verdict, whose curves it read around the best lr of the seeds' mean
# (minillm.analysis.lr_curves; the plans recorded under it keep it); 2: the rules of 2026-11-28 to 2026-12-01 (the
# studies registered then pin them).
VERSION = 4
VERSIONS = (2, 3, 4)


class CompareError(ValueError):
    """A request the runs cannot answer; ``option`` names the command-line option at fault."""

    def __init__(self, option: str, message: str):
        self.option = option
        super().__init__(f"{option}: {message}")


@dataclass(frozen=True)
class Rules:
    """What a comparison decides and how. The defaults are the engine's current rules; ``REGISTERED_BEFORE``
    gives the rules of the studies registered before failed runs counted and the words were adjusted."""

    factor: str = ""
    baseline: str = ""
    metric: str = AUTO_METRIC  # a summary.json number; auto: test_loss, else final_val_loss
    higher_is_better: bool = False
    margin: float = 0.02  # equivalence margin, in the metric's units
    alpha: float = 0.05  # family-wise error of the words; intervals at 1 - alpha
    lr: str | float = "tuned"  # tuned | common | a learning rate
    lr_choice: str = "auto"  # auto | crossfit | validation | same: on what data a tuned / common lr is chosen
    failures: str = "penalize"  # penalize: a failed run counts at ln V; drop: survivors only
    adjust: str = "holm"  # holm: the words control the family-wise error (step-down); none: one planned comparison
    equivalence: str = "tost"  # tost: at level alpha; interval: the (1 - alpha) interval inside the margin
    paired_by: str = "auto"
    interval: str = "t"
    window_error: bool = False
    stability: bool = False  # also the stability verdict over the lr grid (minillm.analysis.lr_curves)
    tolerance: float = 0.1  # nats above an arm's best loss that still count as trainable (the lr range)
    range_margin: float = 0.25  # equivalence margin of the trainable lr range, in decades
    rate_margin: float = 0.1  # equivalence margin of the failure rate over the grid
    version: int = VERSION  # which rules decide: VERSION today; 2 for the studies registered under the rules before

    def with_(self, **changes: Any) -> Rules:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check(self) -> None:
        """CompareError naming the option and what is allowed, for a value no comparison can use."""
        positive = {"margin": self.margin, "tolerance": self.tolerance, "range_margin": self.range_margin,
                    "rate_margin": self.rate_margin}
        for name, value in positive.items():
            if not (is_number(value) and value > 0):
                raise CompareError(OPTIONS[name], f"{value} is invalid; allowed: a number > 0"
                                   + (", in the metric's units" if name == "margin" else ""))
        if not (is_number(self.alpha) and 0 < self.alpha < 1):
            raise CompareError("--alpha", f"{self.alpha} is invalid; allowed: a number in (0, 1)")
        if self.lr not in LR_RULES and not (is_number(self.lr) and self.lr > 0):
            raise CompareError("--lr", f"{self.lr} is invalid; allowed: tuned, common or a learning rate > 0")
        if self.version not in VERSIONS:
            raise CompareError("--rules-version", f"{self.version} is invalid; allowed: "
                               f"{', '.join(map(str, VERSIONS))}")
        if self.lr_choice == "selection-aware":
            if self.version < 3:
                raise CompareError("--lr-choice", "selection-aware is a rule of version 3 on; allowed under version "
                                   f"{self.version}: {', '.join(c for c in LR_CHOICES if c != 'selection-aware')}")
            for name, bad, allowed in (("lr", self.lr == "common", "tuned or a learning rate"),
                                       ("interval", self.interval == "bootstrap", "t"),
                                       ("window_error", self.window_error, "off")):
                if bad:
                    raise CompareError(OPTIONS[name], f"{str(getattr(self, name)).lower()} cannot be combined with "
                                                      f"--lr-choice selection-aware; allowed: {allowed}")
        for name, allowed in (("lr_choice", LR_CHOICES), ("failures", FAILURES), ("adjust", ADJUSTS),
                              ("equivalence", EQUIVALENCE), ("paired_by", PAIRED_BY), ("interval", INTERVALS)):
            if getattr(self, name) not in allowed:
                raise CompareError(OPTIONS[name], f"{getattr(self, name)} is invalid; allowed: {', '.join(allowed)}")


# the command-line option of each rule (minillm-report), for errors that name it
OPTIONS = {"factor": "--compare", "baseline": "--baseline", "metric": "--metric", "margin": "--margin",
           "alpha": "--alpha", "lr": "--lr", "lr_choice": "--lr-choice", "failures": "--failures",
           "adjust": "--no-adjust", "equivalence": "--equivalence", "paired_by": "--paired-by",
           "interval": "--interval", "higher_is_better": "--higher-is-better", "window_error": "--window-error",
           "stability": "--stability", "tolerance": "--tolerance", "range_margin": "--range-margin",
           "rate_margin": "--rate-margin", "version": "--rules-version"}
RULE_NAMES = tuple(f.name for f in fields(Rules))
# The rules minillm's comparisons used before 2026-11-28 (the studies registered then pin them, so their committed
# verdicts regenerate): the final val loss, failed runs left out, the lr chosen on the seeds that judge it, words
# from the unadjusted (1 - alpha) interval.
REGISTERED_BEFORE = {"metric": schema.FINAL_VAL_LOSS, "lr_choice": "same", "failures": "drop", "adjust": "none",
                     "equivalence": "interval", "version": 2}
# The rules of 2026-11-28 to 2026-12-01 (failed runs counted, adjusted words, the lr chosen on validation): the
# studies registered then pin them, so their committed verdicts regenerate.
REGISTERED_V2 = {"version": 2}


# --- the number a run enters a comparison with ---------------------------------------------------------------


def failed(record: Mapping) -> bool:
    return bool(record.get("diverged")) or failed_of(record)


def penalized(metric: str, rules: Rules) -> bool:
    """Whether failed runs enter at ln V: the rule asks for it and the metric is a loss in nats."""
    return rules.failures == "penalize" and metric in LOSSES


def value_of(record: Mapping, metric: str, rules: Rules) -> float | None:
    """The number a run enters the comparison with, or None (left out). Penalized: a failed run at ln V (its
    loss_init), another at min(metric, ln V); else a failed run is left out."""
    loss_init = record.get(schema.LOSS_INIT)
    if penalized(metric, rules) and is_number(loss_init):
        if failed(record):
            return float(loss_init)
        value = record.get(metric)
        return min(float(value), float(loss_init)) if is_number(value) else None
    value = record.get(metric)
    return float(value) if not failed(record) and is_number(value) else None
