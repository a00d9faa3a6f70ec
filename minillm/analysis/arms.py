"""Which runs form an arm (rules version 3): a value of the factor together with its options, and when an arm and its
baseline are paired by seed.

**Options tied to the factor.** A setting that varies within one value of the factor, and whose values there no
other value of the factor ever takes (PowerNorm's ``norm_options`` with group scaling on and off: no other norm has
those options), describes variants of that value, not a condition every arm ran under. Splitting strata on it would
leave each variant in a stratum without the baseline, so nothing would be compared; instead each variant is an arm
of its own, labelled with the value and the options that tell the variants apart::

    powernorm (group_scaling=0), powernorm (group_scaling=1)

A setting the baseline varies in is never tied (there would be no single baseline to compare with): it still splits
strata. A setting shared across values of the factor (a batch size every norm ran at) splits strata as before.

**Pairing.** Pairing by seed removes the seed's share of the noise only when the two arms ran mostly the same seeds:
``--paired-by auto`` pairs when they share at least MIN_SHARED seeds and the shared seeds hold more than half of the
runs of each arm; otherwise the difference is Welch's, with a warning saying why (seeds 0-7 against seeds 7-14 share
one seed: a "paired" difference of that one pair would be noise).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from minillm.analysis.runs import group_runs, hashable, label, sort_key
from minillm.analysis.strata import candidate_keys

MIN_SHARED = 3  # seeds two arms must share to be paired by seed (auto)


def tied_keys(records: Sequence[Mapping], factor: str, baseline: Any) -> list[str]:
    """The settings that take several values within some value of the factor other than the baseline, each of those
    values held by no run of another value of the factor, and that take one value within the baseline."""
    by_value = group_runs(records, [factor])
    base = (hashable(baseline),)
    tied = []
    for key in candidate_keys(records):
        if key == factor:
            continue
        seen: dict[Any, set] = defaultdict(set)  # a value of the key -> the factor values whose runs hold it
        for value, rs in by_value.items():
            for r in rs:
                seen[hashable(r.get(key))].add(value)
        if base in by_value and len({hashable(r.get(key)) for r in by_value[base]}) > 1:
            continue
        varying = [value for value, rs in by_value.items()
                   if value != base and len({hashable(r.get(key)) for r in rs}) > 1]
        if varying and all(seen[hashable(r.get(key))] == {value} for value in varying for r in by_value[value]):
            tied.append(key)
    return tied


def _text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else label(value)


def _parts(variants: Sequence[Mapping], key: str, record: Mapping) -> list[str]:
    """What tells ``record``'s variant apart in ``key``: the sub-keys of a dict that differ across the variants, or
    the key (its last dotted part) and value."""
    values = [v.get(key) for v in variants]
    if all(isinstance(v, Mapping) for v in values):
        subs = sorted({s for v in values for s in v}, key=str)
        differ = [s for s in subs if len({hashable(v.get(s)) for v in values}) > 1]
        return [f"{s}={_text(record.get(key).get(s))}" for s in differ]
    if len({hashable(v) for v in values}) < 2:
        return []
    return [f"{key.rsplit('.', 1)[-1]}={_text(record.get(key))}"]


def with_options(records: Sequence[dict], factor: str, baseline: Any) -> tuple[list[dict], dict[Any, dict]]:
    """The records with each variant of a value (tied_keys) as an arm of its own: its factor value replaced by
    the label "value (option=..., ...)"; and arm -> {"value": the factor's value, "options": {key: value}} for every
    arm (options empty for an arm without variants)."""
    tied = tied_keys(records, factor, baseline)
    arms: dict[Any, dict] = {}
    out = []
    for (value,), rs in group_runs(records, [factor]).items():
        variants = [rs_[0] for rs_ in group_runs(rs, tied).values()] if tied else [rs[0]]
        keys = [k for k in tied if len({hashable(v.get(k)) for v in variants}) > 1]
        if not keys:
            arms[value] = {"value": rs[0].get(factor), "options": {}}
            out += rs
            continue
        for members in group_runs(rs, keys).values():
            parts = list(dict.fromkeys(p for k in keys for p in _parts(variants, k, members[0])))
            name = f"{label(members[0].get(factor))} ({', '.join(parts)})"
            arms[name] = {"value": members[0].get(factor), "options": {k: members[0].get(k) for k in keys}}
            out += [{**r, factor: name} for r in members]
    return out, arms


def unpaired_reason(arm: Sequence[Mapping], base: Sequence[Mapping]) -> str | None:
    """Why seed pairing would not pair these arms (fewer than MIN_SHARED shared seeds, or shared seeds holding no
    more than half of an arm's runs), or None when it does."""
    shared = ({r.get("seed") for r in arm} & {r.get("seed") for r in base}) - {None}
    seeds = ", ".join(map(label, sorted(shared, key=sort_key))) or "none"
    if len(shared) < MIN_SHARED:
        return (f"arm and baseline share {len(shared)} seed(s) ({seeds}), fewer than {MIN_SHARED}: compared "
                "unpaired (Welch)")
    for who, rs in (("arm", arm), ("baseline", base)):
        held = sum(r.get("seed") in shared for r in rs)
        if 2 * held <= len(rs):
            return (f"the {len(shared)} seeds arm and baseline share hold {held} of the {who}'s {len(rs)} runs, not "
                    "most: compared unpaired (Welch)")
    return None
