"""A finding's numbers, structured and checked against the files they come from.

A round's finding.json says its finding in one sentence (``finding``) and may give a headline for
experiments/README.md (``headline``: ``{"group": ..., "text": ...}``, or a list of them). Its ``claims`` tie the
numbers those sentences write to the results they come from, one claim per estimate:

    {"claim": "nGPT at 400 steps - the baseline at 400", "units": "nats (final val loss)",
     "written": "-0.042 [-0.067, -0.018]",
     "estimate": "results.json:holm/parts/F1/mean",
     "interval": ["results.json:holm/parts/F1/ci_low", "results.json:holm/parts/F1/ci_high"]}

``written`` is a piece of the finding's (or a headline's) text, as it stands there; its numbers are the estimate
(one key, a list of keys where it writes several values, such as a range over seeds or a count of n, or ``null``
where it writes an interval alone) and then the interval's two ends (no interval: ``null``), each the number a
*result key* holds, rounded as written. A result key is ``<file>:<path>`` (a JSON file of the round: results.json,
verdicts.json, ...; the path's parts split at ``/``, list items by index, a key holding a ``/`` matched whole;
``#n`` after a path to a text, such as a verdict's, names the n-th number it writes) or ``headlines:<label>/<i>``
(the i-th value of experiments.studies.headlines' numbers for the round: its scale and labelled re-analyses).
A number attached to the wrong claim fails: swapped in the text, the claim's ``written`` is no longer there;
swapped in the claims too, its numbers are no longer its keys'. Every interval a finding with claims writes, in
each of its texts (the finding, each headline), must lie inside one of them written there.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

KEYS = {"question", "finding"}  # what every finding.json holds
OPTIONAL = {"headline", "claims", "re_reading", "observation", "provenance"}
CLAIM_KEYS = {"claim", "units", "written", "estimate", "interval"}
NOT_RUN = "not yet run"

# What a finding's text writes as a number, with the digits written. Not numbers: a citation's year, a theorem or
# figure, OLMo 2, a reference to another round, a commit, "95% CI"; nor digits inside a name (S7, fp16, GPT-2,
# r1_grid, E2). A range's tail is both ends': 1.4-1.6e-2, 44-70%, 0.62-0.81x.
_NOT_NUMBERS = re.compile("|".join((
    r"(?:et al\.|& [A-Z][\w-]*)\s+(?:19|20)\d\d", r"\barXiv \S+", r"\b(?:Thm|Theorem|Fig\.|Figure|footnote)\s+\d+",
    r"\bOLMo \d+", r"\b[Rr]ounds? \d+(?:\s*[-–]\s*\d+)?", r"\bS\d+ r\d+(?:\s*[-–]\s*\d+)?",
    r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", r"\b95% (?:CI|interval)")))
_RANGE = re.compile(r"(\d[\d.]*)\s*[-–]\s*(\d[\d.]*)(e[-−+]?\d+|%|x|M)")
_NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z][-−])([-−+](?=\d))?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:e([-−+]?\d+))?"
                     r"(%|x|M|k)?(?![\w.]\d|\w)")
# a written interval, [+0.088, +0.130]; not a band a rule reads against ("within [0.8, 1.25]")
_INTERVAL = re.compile(r"(?<!within )(?<!inside )\[[-−+]?\d[^\]]*\]")
SCALE = {"%": 100.0, "M": 1e-6, "k": 1e-3}  # a source number s reads as s * this in a number written with the unit


def written_numbers(text: str) -> list[re.Match]:
    text = _RANGE.sub(lambda m: f"{m[1]}{m[3]} {m[2]}{m[3]}", _NOT_NUMBERS.sub(" ", text))
    return list(_NUMBER.finditer(text))


def value(m: re.Match) -> float:
    sign, whole, frac, exp = m[1] or "", m[2].replace(",", ""), m[3] or "", (m[4] or "").replace("−", "-")
    return float(f"{sign.replace('−', '-')}{whole}{frac}" + (f"e{exp}" if exp else ""))


def rounds_to(m: re.Match, source: float) -> bool:
    """Whether ``source``, rounded as the number ``m`` is written (its decimals; its significant digits when it has an
    exponent or ends in zeros), is that number; unsigned when it is written without a sign."""
    written = value(m)
    if not m[1]:
        written, source = abs(written), abs(source)
    whole, frac = m[2].replace(",", ""), (m[3] or "")[1:]
    if m[4] is not None or (not frac and whole != "0" and whole.endswith("0")):
        digits = max(1, len((whole + frac).lstrip("0")) if m[4] is not None else len(whole.rstrip("0")))
        return source != 0 and math.isclose(float(f"{source:.{digits - 1}e}"), written, rel_tol=1e-9)
    return math.isclose(round(source, len(frac)), written, rel_tol=1e-9, abs_tol=1e-12)


def reads_as(m: re.Match, source: float) -> bool:
    """Whether the written number ``m`` is ``source`` (in its unit: a percentage of a fraction, M of a count)."""
    return rounds_to(m, source * SCALE.get(m[5], 1.0)) or rounds_to(m, source)


def _step(data: Any, parts: list[str]) -> Any:
    """Follow ``parts`` into ``data``; a dict key may hold a ``/`` (the longest matching run of parts is taken)."""
    if not parts:
        return data
    if isinstance(data, list):
        return _step(data[int(parts[0])], parts[1:])
    for n in range(len(parts), 0, -1):
        key = "/".join(parts[:n])
        if key in data:
            return _step(data[key], parts[n:])
    raise KeyError(parts[0])


def resolve(folder: Path, key: str) -> float:
    """The number a result key names in a round's folder (module docstring)."""
    source, _, path = key.partition(":")
    if source == "headlines":
        from experiments.studies import headlines

        label, _, i = path.rpartition("/")
        return float(headlines.numbers(folder)[label][int(i)])
    if "/" in source or not source.endswith(".json") or not (folder / source).exists():
        raise KeyError(f"{source}: not a JSON file of the round")
    path, _, nth = path.partition("#")
    found = _step(json.loads((folder / source).read_text()), path.split("/") if path else [])
    if nth and isinstance(found, str):  # the n-th number a result's verdict text writes
        found = value(written_numbers(found)[int(nth)])
    if isinstance(found, bool) or not isinstance(found, (int, float)):
        raise KeyError(f"{path}: not a number")
    return float(found)


def headlines(finding: dict) -> list[dict]:
    """A finding's headlines: none, one ({"group", "text"}) or a list of them (a round with two results to name)."""
    found = finding.get("headline", [])
    return [found] if isinstance(found, dict) else list(found)


def texts(finding: dict) -> list[str]:
    """What a finding writes for readers: its question, its finding, its headlines' text and its labels."""
    return [finding["question"], finding["finding"], *(h["text"] for h in headlines(finding)),
            *(finding[k] for k in ("re_reading", "observation", "provenance") if k in finding)]


def claim_problems(folder: Path, finding: dict) -> list[str]:
    """Why a finding's claims do not hold: a claim missing a field, its ``written`` not in the text, its numbers not
    its keys' (or not as many as it names)."""
    said, problems = " ".join(texts(finding)), []
    for i, claim in enumerate(finding.get("claims", [])):
        name = f"claim {i} ({claim.get('claim', '?')})"
        if set(claim) != CLAIM_KEYS:
            problems.append(f"{name}: fields {sorted(claim)}, expected {sorted(CLAIM_KEYS)}")
            continue
        if claim["written"] not in said:
            problems.append(f"{name}: {claim['written']!r} is not in the finding's text")
        estimate = claim["estimate"] or []
        estimate = [estimate] if isinstance(estimate, str) else estimate
        keys = [*estimate, *(claim["interval"] or [])]
        numbers = written_numbers(claim["written"])
        if len(numbers) != len(keys):
            problems.append(f"{name}: {claim['written']!r} writes {len(numbers)} numbers, the claim names "
                            f"{len(keys)} keys")
            continue
        for m, key in zip(numbers, keys, strict=True):
            try:
                source = resolve(folder, key)
            except (KeyError, IndexError, ValueError) as e:
                problems.append(f"{name}: {key}: {e}")
                continue
            if not reads_as(m, source):
                problems.append(f"{name}: {m[0]} is not {key} ({source:.6g})")
    if finding.get("claims"):  # each text on its own: every interval it writes sits inside a claim's written there
        written = [c["written"] for c in finding["claims"] if c.get("written")]
        for text in texts(finding):
            spans = [(m.start(), m.end()) for w in written for m in re.finditer(re.escape(w), text)]
            problems += [f"the interval {iv[0]} in {text[:40]!r}... is in no claim written there"
                         for iv in _INTERVAL.finditer(text)
                         if not any(a <= iv.start() and iv.end() <= b for a, b in spans)]
    return problems


def status_problems(folder: Path, finding: dict) -> list[str]:
    """A round that ran (its runs committed) called not yet run, or one without runs given results."""
    ran = (folder / "runs.jsonl").exists() or (folder / "results.json").exists()
    says_not_run = any(NOT_RUN in t for t in texts(finding))
    if ran and says_not_run:
        return [f"{folder.name}: its runs are committed, its finding says {NOT_RUN!r}"]
    return []


def problems(folder: Path) -> list[str]:
    """Everything wrong with a round's (or benchmark's) finding.json: its fields, its claims, its status."""
    finding = json.loads((folder / "finding.json").read_text())
    found = []
    if not KEYS <= set(finding) <= KEYS | OPTIONAL or not all(finding[k] for k in KEYS):
        found.append(f"fields {sorted(finding)}: expected {sorted(KEYS)} and any of {sorted(OPTIONAL)}")
    found += [f"headline fields {sorted(h)}: expected ['group', 'text']" for h in headlines(finding)
              if set(h) != {"group", "text"}]
    return found + claim_problems(folder, finding) + status_problems(folder, finding)
