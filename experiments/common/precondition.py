"""The precondition gate: a published remedy is tested only where the problem it answers shows up.

A norm that answers a problem (the "curse of depth", massive activations, ...) can only show its benefit where
that problem exists. A round whose baseline lacks it has not tested the claim, whatever its runs show, and a
"not at this scale" or "reversed" there invites a reading as counter-evidence that the data do not support.
Every round's results therefore carry a ``precondition`` block: the premise, the quantity that measures it on the
baseline, the threshold, the measured values, and a status:

    present        every seed of every cell meets the threshold
    absent         no seed of any cell meets it: the round's verdict words become PREMISE_ABSENT (``gate``)
    mixed          some seeds or cells meet it: the words stand, and the block says where it held
    not recorded   the runs did not log the quantity (a proxy may be given; it decides nothing)
    none           the claim needs no premise beyond its setting (a cost, a parity, a failure rate)

The premises (PREMISES) and their thresholds live here, once. Where they came from: the thresholds were fixed in
this module after the data of S5, S8 and S10 had been seen (their retroactive gate is a reading, disclosed as
such in those READMEs); every round pre-registered after it uses them as fixed before its runs. A cell's
interval (minillm.analysis.stats.against_threshold) is reported beside each status; the status itself counts seeds, a
rule that two or three seeds can apply. ``parts`` counts a multi-part verdict with Holm's adjustment across its
parts; ``against`` reads one seed mean against its threshold given its interval. A pre-registered test that
could not have failed (its outcome follows from the construction of the setting) is restated with the word
OBSERVATION, and its text says why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from minillm.analysis import stats as st

PREMISE_ABSENT = "premise absent at this scale"
OBSERVATION = "observation"  # a pre-registered test that could not have failed, restated as what it saw
STATUSES = ("present", "absent", "mixed", "not recorded", "none")


@dataclass(frozen=True)
class Premise:
    """A measurable premise: it holds on a baseline run when ``quantity`` is ``direction`` ``threshold``."""

    key: str
    problem: str  # what the published remedy answers
    quantity: str  # how it is measured, on which runs
    direction: str  # "at least" / "at most"
    threshold: float
    why: str  # where the threshold comes from

    def holds(self, value: float) -> bool:
        return value >= self.threshold if self.direction == "at least" else value <= self.threshold


PREMISES = {p.key: p for p in (
    Premise("idle_deep_layers", "Pre-LN's deep layers do little (the curse of depth; Mix-LN, LayerNorm Scaling)",
            "mean layer-drop loss of the second half of the blocks / that of the first half (the val loss with one "
            "block replaced by the identity, minus the intact model's), Pre-LN baseline, last checkpoint",
            "at most", 0.25,
            "deep blocks 'removable at little cost' (Li et al. 2024, Sun et al. 2025): a deep block costs at most a "
            "quarter of what an early one costs"),
    Premise("stream_growth", "Pre-LN's residual stream grows with depth, so deep blocks act near the identity "
            "(Sun et al. 2025; Peri-LN)",
            "(r_L / r_1) / sqrt(L): the residual RMS after the last block over that after the first, Pre-LN "
            "baseline, end of training, against sqrt(L)",
            "at least", 1.0,
            "sqrt(L) is the growth of L equal, independent increments, the least Sun et al.'s variance argument "
            "gives; a stream that grows less does not damp its deep blocks more than equal blocks would"),
    Premise("massive_activations", "a few residual activations far larger than the rest (Peri-LN's motivation)",
            "max |h| / median |h| of the residual stream, Pre-LN baseline",
            "at least", 100.0,
            "massive activations are reported at 100x to 10,000x the median (Sun, Chen, Kolter, Liu 2024)"),
    Premise("tanh_saturation", "DyT's tanh squashes the extreme inputs a norm would rescale (Zhu et al. 2025)",
            "fraction of DyT inputs with |alpha x| >= 1 (tanh 24% below the identity), every DyT site",
            "at least", 0.01,
            "at least 1% of the inputs outside tanh's linear range; below it DyT is a scaled identity"),
)}


def measure(key: str, cells: Mapping[str, Sequence[float]], source: str, alpha: float = 0.05,
            log: bool = False) -> dict:
    """The block of a premise measured per cell (e.g. "L=12") and seed: each cell's values, their mean and its
    (1 - alpha) t interval (on the log scale when ``log``, for a ratio), its status, and the round's status."""
    premise = PREMISES[key]
    out = {}
    for cell, values in cells.items():
        vals = [float(v) for v in values if v is not None and math.isfinite(v)]
        hits = sum(premise.holds(v) for v in vals)
        interval = against(vals, premise.threshold, premise.direction, alpha, log)
        out[cell] = {"values": vals, "mean": interval["mean"], "ci": [interval["ci_low"], interval["ci_high"]],
                     "status": "not recorded" if not vals else "present" if hits == len(vals) else
                     "absent" if hits == 0 else "mixed"}
    return {**_head(premise), "source": source, "cells": out, "status": overall(c["status"] for c in out.values())}


def not_recorded(key: str, why: str, proxy: Mapping[str, Any] | None = None, proxy_quantity: str = "") -> dict:
    """The block of a premise the runs did not record; ``proxy``: cell -> what was recorded instead, measured as
    ``proxy_quantity`` (it decides nothing)."""
    return {**_head(PREMISES[key]), "source": why, "cells": {}, "status": "not recorded",
            **({"proxy": dict(proxy), "proxy_quantity": proxy_quantity} if proxy else {})}


def reported(problem: str, quantity: str, rule: str, values: Mapping[str, Any], status: str, source: str) -> dict:
    """The block of a premise that is not one of PREMISES, or that another round measured: its values as given,
    its status (present / absent / mixed / not recorded) and where they come from."""
    if status not in STATUSES[:4]:
        raise ValueError(f"status {status!r}; allowed: {', '.join(STATUSES[:4])}")
    return {"premise": "reported", "problem": problem, "quantity": quantity, "rule": rule, "source": source,
            "cells": {k: {"values": [v], "status": status} for k, v in values.items()}, "status": status}


def none(why: str) -> dict:
    """The block of a claim with no premise beyond its setting."""
    return {"premise": None, "status": "none", "why": why}


def _head(p: Premise) -> dict:
    d = asdict(p)
    return {"premise": d.pop("key"), **d, "rule": f"{p.direction} {p.threshold:g}"}


def overall(statuses: Iterable[str]) -> str:
    found = [s for s in statuses if s != "not recorded"]
    if not found:
        return "not recorded"
    return found[0] if len(set(found)) == 1 else "mixed"


def gate(word: str, *blocks: Mapping[str, Any]) -> str:
    """The verdict word a rule gave, or PREMISE_ABSENT when a premise the claim needs is absent (a block with
    status absent, or a cell's status passed as a block {"status": ...})."""
    return PREMISE_ABSENT if any(b.get("status") == "absent" for b in blocks) else word


def cell(block: Mapping[str, Any], name: str) -> dict:
    """One cell of a measured block as a block of its own (for a verdict judged per cell)."""
    return block["cells"].get(name) or {"status": "not recorded"}


def line(block: Mapping[str, Any]) -> str:
    """The block in one markdown line for results.md."""
    if block["status"] == "none":
        return f"**Precondition**: none beyond the setting ({block['why']})."
    head = (f"**Precondition** ({block['premise']}: {block['problem']}): {block['quantity']}, premise when "
            f"{block['rule']}")
    if not block["cells"]:
        proxy = block.get("proxy")
        return (f"{head}: **not recorded** ({block['source']})" +
                (f"; proxy ({block['proxy_quantity']}), deciding nothing: "
                 f"{', '.join(f'{k} {_num(v)}' for k, v in proxy.items())}" if proxy else "") + ".")
    cells = "; ".join(f"{name} {' / '.join(_num(v) for v in c['values'])} ({c['status']})"
                      for name, c in block["cells"].items())
    return f"{head}: {cells}. Status: **{block['status']}** ({block['source']})."


def _num(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


# --- a seed mean against a threshold, and multi-part verdicts ------------------------------------------------------


def against(values: Sequence[float], threshold: float, direction: str = "at least", alpha: float = 0.05,
            log: bool = False) -> dict:
    """minillm.analysis.stats.against_threshold, on log values and log threshold when ``log`` (a ratio; the interval is
    given back on the ratio's scale), plus ``reading``: "holds" when the whole interval lies on the rule's side of
    the threshold, "fails" when it lies wholly on the other side, "unresolved" when it crosses it (or there is
    none), whatever the seed mean says."""
    vals = [float(v) for v in values]
    if log:
        vals, threshold_used = [math.log(v) for v in vals], math.log(threshold)
    else:
        threshold_used = threshold
    r = st.against_threshold(vals, threshold_used, direction, alpha)
    if log:
        back = {k: (math.exp(r[k]) if r[k] is not None else None) for k in ("mean", "ci_low", "ci_high")}
        r = {**r, **back}
    low, high = r["ci_low"], r["ci_high"]
    if low is None:
        reading = "unresolved"
    elif direction == "at least":
        reading = "holds" if low >= threshold else "fails" if high < threshold else "unresolved"
    else:
        reading = "holds" if high <= threshold else "fails" if low > threshold else "unresolved"
    return {**r, "threshold": threshold, "direction": direction, "reading": reading}


def parts(named: Mapping[str, tuple], alpha: float = 0.05) -> dict:
    """A verdict of several parts, each "the seed mean of these values is <direction> <threshold>", given as
    name -> (values, threshold, direction) or (values, threshold, direction, log) (log: a ratio, read on the log
    scale): how many hold on the seed means, and how many hold with their one-sided p Holm-adjusted across the
    parts below alpha. Returns {n, on_means, holm, parts: {name: against(...) + p_holm, significant}, text}."""
    each = {name: against(*spec[:3], alpha=alpha, log=bool(spec[3:] and spec[3])) for name, spec in named.items()}
    adjusted = st.holm([r["p"] for r in each.values()])
    for r, p in zip(each.values(), adjusted, strict=True):
        r["p_holm"], r["significant"] = p, p is not None and p < alpha
    n, on_means = len(each), sum(bool(r["holds_on_mean"]) for r in each.values())
    holm = sum(r["significant"] for r in each.values())
    return {"n": n, "on_means": on_means, "holm": holm, "parts": each,
            "text": f"{holm} of {n} parts, Holm-adjusted ({on_means} of {n} on the seed means)"}


def count(holm: Mapping[str, Any], prefix: str) -> str:
    """"k of n parts, Holm-adjusted (m on the seed means)" for the parts of ``parts`` whose name starts so."""
    found = [r for k, r in holm["parts"].items() if k.startswith(prefix)]
    return (f"{sum(r['significant'] for r in found)} of {len(found)} parts, Holm-adjusted "
            f"({sum(bool(r['holds_on_mean']) for r in found)} on the seed means)")


def tanh_saturation(model: Any, idx: Any) -> float:
    """The fraction of the inputs of every DyT (and Derf) of ``model`` with |alpha x| >= 1 (Derf's: |alpha x + shift|,
    the same at init) over one forward pass of the token ids ``idx`` (B, T): tanh_saturation's quantity, the
    probe's norm/<site>/saturation (DyT.saturated) counted over every such site."""
    import torch

    from minillm.norms.token import DyT

    counts = [0, 0]

    def hook(module: Any, args: tuple, _out: Any) -> None:
        counts[0] += int(module.saturated(args[0]).sum())
        counts[1] += args[0].numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, DyT)]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in handles:
            h.remove()
    return counts[0] / counts[1] if counts[1] else math.nan
