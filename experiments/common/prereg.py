"""What the pre-registered rounds that have not run yet share: their verdict before the data, the reading of a
rule "the seed mean of these paired differences is at least / at most T" as a verdict word, the budget in tokens
per parameter, the compute estimate on the project's 2-core CPU, and the check that the runs hold what the rules
read (a metric or a config field that must exist before the run).

A pre-registered round commits its ``analyze.py`` (rules, thresholds, precondition, the exact sweep commands in
its docstring, the analysis that will read the runs) and a ``finding.json`` saying NOT_RUN; its ``test_rules.py``
runs its analysis on made-up runs. Its data commit later adds ``runs.jsonl`` and ``results.json`` (then
experiments.common.layout finds it as an analysis, and the slow test regenerates it) and replaces the verdict.

Every threshold reading goes through experiments.common.precondition.against (minillm.analysis.stats.against_threshold):
"holds" (the whole 95% interval on the rule's side) -> "confirmed", "fails" (wholly on the other side) -> "not at
this scale", "unresolved" (it crosses the threshold) -> "unresolved"; a multi-part rule counts its parts with
Holm's adjustment (precondition.parts); an absent premise turns a word into "premise absent at this scale".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from experiments.common import precondition as pre
from minillm.outcome import loss_for_comparison

NOT_RUN = "pre-registered, not yet run"
WORDS = {"holds": "confirmed", "fails": "not at this scale", "unresolved": "unresolved"}
BATCH_TOKENS = 16 * 64  # the CPU studies' batch 16 x context 64


def word(reading: Mapping[str, Any]) -> str:
    """The verdict word of one part of precondition.parts / precondition.against."""
    return WORDS[reading["reading"]]


def by_seed(runs: Iterable[dict], value: Callable[[dict], float | None]) -> dict[int, float]:
    """seed -> value of the runs given (one per seed), leaving out the runs without a value."""
    out = {}
    for r in runs:
        v = value(r)
        if v is not None and math.isfinite(v):
            out[r["seed"]] = float(v)
    return out


def diffs(arm: Mapping[int, float], baseline: Mapping[int, float]) -> list[float]:
    """arm[seed] - baseline[seed] over the seeds both hold, in seed order."""
    return [arm[s] - baseline[s] for s in sorted(arm) if s in baseline]


def ratios(arm: Mapping[int, float], baseline: Mapping[int, float]) -> list[float]:
    """arm[seed] / baseline[seed] over the seeds both hold (baseline non-zero), in seed order."""
    return [arm[s] / baseline[s] for s in sorted(arm) if s in baseline and baseline[s]]


def tokens_per_parameter(steps: int, n_params: int, batch_tokens: int = BATCH_TOKENS) -> float:
    return steps * batch_tokens / n_params


def steps_for(tokens_per_param: float, n_params: int, batch_tokens: int = BATCH_TOKENS) -> int:
    """The steps that give ``tokens_per_param`` tokens per parameter, rounded up to a hundred."""
    return int(math.ceil(tokens_per_param * n_params / batch_tokens / 100.0) * 100)


def estimate(n_runs: int, tokens: float, tokens_per_s: float, extra_s: float = 0.0, parallel: int = 2) -> dict:
    """Wall-clock hours of a sweep on the 2-core CPU: ``n_runs`` runs of ``tokens`` tokens each at ``tokens_per_s``
    per process (measured with two processes side by side, as the studies run), ``parallel`` at a time, plus
    ``extra_s`` of evaluation after it."""
    seconds = math.ceil(n_runs / parallel) * tokens / tokens_per_s + extra_s
    return {"runs": n_runs, "tokens_per_run": tokens, "tokens_per_s": tokens_per_s, "hours": seconds / 3600}


def require(runs: Sequence[dict], what: str, present: Callable[[dict], bool]) -> None:
    """Stop the analysis when a run lacks what the rules read (a metric or config field that had to exist
    before the run): the round's results would otherwise be computed from nothing."""
    missing = [r.get("run_dir") or f"seed {r.get('seed')}" for r in runs if not present(r)]
    if missing:
        raise SystemExit(f"{len(missing)} run(s) lack {what} (the pre-registration requires it before the run): "
                         + ", ".join(map(str, missing[:5])))


def ended_loss(run: Mapping[str, Any]) -> float:
    """The loss a two-stage round reads: a crashed run (status failed) at ln V, any other through
    minillm.outcome.loss_for_comparison (a diverged one at ln V, a completed one at its final val loss)."""
    return run["loss_init"] if run.get("status") == "failed" else loss_for_comparison(run)


def run_name(run: Mapping[str, Any]) -> str:
    return str(run.get("run_dir") or f"lr {run.get('lr'):g} seed {run.get('seed')}")


def require_ended(runs: Iterable[Mapping[str, Any]]) -> None:
    """Stop the analysis on a run that has not ended: stopped by a signal, or short of its budget without having
    diverged or crashed (the round's run.sh again resumes one a signal stopped)."""
    if open_ := [run_name(r) for r in runs if r.get("status") == "preempted"
                 or (r.get("status") != "failed" and not r.get("diverged") and r.get("steps") != r["max_steps"])]:
        raise SystemExit(f"{len(open_)} run(s) have not ended (stopped by a signal, or short of their budget): "
                         f"{', '.join(open_[:5])}; run.sh again resumes a run a signal stopped (one killed without "
                         "a checkpoint runs again once its folder is removed)")


def require_once(runs: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], tuple],
                 describe: Callable[[tuple], str]) -> None:
    """Stop the analysis when two runs share ``key`` (one cell, lr and seed): the rules read one run each."""
    keys = [key(r) for r in runs]
    if twice := sorted({k for k in keys if keys.count(k) > 1}):
        raise SystemExit("more than one run of one cell, lr and seed: " + "; ".join(map(describe, twice[:5])))


def interval_line(name: str, result: Mapping[str, Any], text: str, word_: str, level: str = "95%") -> str:
    """A part read on its own interval (precondition.against) with the rule's word, in one line."""
    low, high = result["ci_low"], result["ci_high"]
    ci = "no interval" if low is None else f"{level} CI [{low:+.3f}, {high:+.3f}]"
    return (f"{name}: {text}, seed mean {result['mean']:+.3f}, {ci} (its interval: {result['reading']} against "
            f"{result['threshold']:+g}; the rule's word: {word_})")


def verdict_line(name: str, result: Mapping[str, Any], text: str) -> tuple[str, str]:
    """(word, text) of a one-part rule read with its interval (a precondition.parts entry)."""
    low, high = result["ci_low"], result["ci_high"]
    ci = "no interval" if low is None else f"95% CI [{low:+.3f}, {high:+.3f}]"
    return word(result), f"{name}: {text}, seed mean {result['mean']:+.3f}, {ci} ({result['reading']} against " \
                         f"{result['threshold']:g}; Holm-adjusted p {_p(result.get('p_holm'))})"


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.3f}"


def gated(word_: str, *blocks: Mapping[str, Any]) -> str:
    return pre.gate(word_, *blocks)
