"""Which runs a verdict reads, and against what: the settings that split a comparison into strata (every setting a
run records that varies within an arm, except the seed and the lr), the factor's values, the metric (auto: the
held-out test loss when every trained run has one), the checks of a request, and the warnings when arm and baseline
ran in different environments (CPU kernels, torch, code)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from minillm import schema
from minillm.analysis.rules import AUTO_METRIC, LOSSES, CompareError, Rules
from minillm.analysis.runs import group_runs, hashable, label
from minillm.outcome import failed_of, is_number

# config keys of summary.json that split a comparison into strata when they vary within an arm, in this order (a key
# that follows the ones before it, e.g. norm_options after norm, does not); then every key of ``settings``
STRATUM_KEYS = ("norm", "placement", "init", "qk_norm", "precision", "precision_used", "warmup_steps", "n_layers",
                "dim", "n_heads", "n_kv_heads", "tie_embeddings", "vocab_size", "max_seq_len", "batch_size", "seq_len",
                "max_steps", "grad_clip", "weight_decay", "z_loss", "norm_eps", "norm_options", "attn_norm_options",
                "optimizer", "adamw_lr")
NEVER_SPLIT = ("seed", "lr", "name", "tags", "settings.seed", "settings.data.seed", "settings.optimizer.lr")
ENVIRONMENT = (("cpu_capability", "CPU kernels"), ("torch_version", "torch versions"), ("code", "git commits"))
# Another CPU's vector kernels move a run's losses by a few thousandths of a nat (README, "The default run"):
# a difference below this between arms that ran in different environments is not evidence.
PROVENANCE_NOISE = 0.005


def matches(value: Any, text: str) -> bool:
    """``text`` (from a command line or a plan) names ``value``: 8 names 8.0, true names True, null names None."""
    if isinstance(value, bool) or value is None:
        return text.lower() in {True: ("true", "1", "yes"), False: ("false", "0", "no"), None: ("none", "null")}[value]
    if isinstance(value, (int, float)):
        try:
            return math.isclose(float(value), float(text), rel_tol=1e-9)
        except ValueError:
            return False
    return label(value) == text or str(value) == text


def candidate_keys(records: Sequence[Mapping]) -> list[str]:
    settings = sorted({k for r in records for k in r if k.startswith("settings.")})
    return [k for k in (*STRATUM_KEYS, *settings) if k not in NEVER_SPLIT]


def strata_keys(records: Sequence[Mapping], factor: str) -> list[str]:
    """The settings (factor left out) that take several values within one arm, each counted only when it still
    varies once the arm and the keys chosen before it are fixed."""
    chosen: list[str] = []
    for key in candidate_keys(records):
        if key != factor and any(len({hashable(r.get(key)) for r in members}) > 1
                                 for members in group_runs(records, [factor, *chosen]).values()):
            chosen.append(key)
    return chosen


def factor_values(records: Sequence[Mapping], factor: str) -> list[Any]:
    return [members[0].get(factor) for members in group_runs(records, [factor]).values()]


def varying_keys(records: Sequence[Mapping]) -> list[str]:
    """The config and environment keys that take several values across the runs (the factors one can compare)."""
    keys = [*candidate_keys(records), *(k for k, _ in ENVIRONMENT if k != "code"), "git_commit", "minillm_version"]
    return [k for k in keys if any(k in r for r in records) and len(group_runs(records, [k])) > 1]


def resolve_metric(records: Sequence[Mapping], metric: str) -> tuple[str, str | None]:
    """(the metric compared, a note on how auto chose it)."""
    if metric != AUTO_METRIC:
        return metric, None
    trained = [r for r in records if not failed_of(r)]
    if trained and all(is_number(r.get(schema.TEST_LOSS)) for r in trained):
        return schema.TEST_LOSS, None
    missing = sum(not is_number(r.get(schema.TEST_LOSS)) for r in trained)
    return schema.FINAL_VAL_LOSS, (f"metric auto: {missing} of {len(trained)} runs that trained have no test loss "
                              "(test=false?): the verdicts read the final val loss")


def check_summaries(runs: Sequence[Any]) -> None:
    """CompareError naming the run for a summary that is not a run's by minillm.schema (a required field missing,
    a field of another type: a loss of "abc" never silently turns the metric to another)."""
    for run in runs:
        summary = getattr(run, "summary", run)
        if wrong := schema.problems(summary):
            where = getattr(run, "dir", None) or summary.get("run_dir") or "a run"
            raise CompareError("sweep", f"{where}: not a readable summary.json ({'; '.join(wrong)})")


def check_request(records: Sequence[Mapping], rules: Rules, metric: str) -> Any:
    """Raise CompareError (naming the option and what is allowed) for a request the runs cannot answer; return the
    baseline's value as the runs hold it."""
    if not records:
        raise CompareError("sweep", "no run with an outcome (summary.json) to compare")
    rules.check()
    factor, baseline = rules.factor, rules.baseline
    allowed = ", ".join(varying_keys(records)) or "none (nothing varies across these runs)"
    if factor in ("seed", "lr"):
        raise CompareError("--compare", f"{factor} cannot be the factor (seeds are paired, lrs tuned); allowed: "
                                        f"{allowed}")
    if not any(factor in r for r in records):
        raise CompareError("--compare", f"unknown factor {factor!r}, not a key of the runs' summary.json; allowed: "
                                        f"{allowed}")
    values = factor_values(records, factor)
    if len(values) < 2:
        raise CompareError("--compare", f"{factor} does not vary (every run has {label(values[0])}); allowed: "
                                        f"{allowed}")
    found = [v for v in values if matches(v, str(baseline))]
    if not found:
        raise CompareError("--baseline", f"{baseline!r} is not a value of {factor}; allowed: "
                                         f"{', '.join(label(v) for v in values)}")
    if not any(is_number(r.get(metric)) for r in records):
        numeric = sorted({k for r in records for k, v in r.items() if is_number(v) and k not in STRATUM_KEYS
                          and not k.startswith("settings.")})
        raise CompareError("--metric", f"{metric!r} has no value in the runs' summary.json; allowed: "
                                       f"{AUTO_METRIC}, {', '.join(numeric)}")
    return found[0]


def _environment(record: Mapping, key: str) -> Any:
    if key != "code":
        return record.get(key)
    commit = record.get("git_commit")
    return f"{commit[:10]}{'+dirty' if record.get('git_dirty') else ''}" if commit else None


def environment_warnings(arm: Sequence[Mapping], base: Sequence[Mapping], metric: str,
                          diff: float | None) -> tuple[list[str], bool]:
    """Warnings for arms that ran in different environments, and whether one makes the verdict not informative."""
    warnings, blocking = [], False
    for key, what in ENVIRONMENT:
        a, b = ({_environment(r, key) for r in rs} - {None} for rs in (arm, base))
        if a and b and a != b:
            small = metric not in LOSSES or diff is None or abs(diff) < PROVENANCE_NOISE
            blocking |= small
            size = (f"the difference ({'n/a' if diff is None else f'{diff:+.4g}'}) is smaller than the "
                    f"~{PROVENANCE_NOISE} nats that alone can move: not informative" if small else
                    f"the difference ({diff:+.4g}) is larger than the ~{PROVENANCE_NOISE} nats that alone moves")
            warnings.append(f"arm and baseline ran on different {what} ({', '.join(sorted(map(str, a)))} vs "
                            f"{', '.join(sorted(map(str, b)))}); {size}")
    return warnings, blocking
