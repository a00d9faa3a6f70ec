"""plan.json as a hash-chained record: every stage of a pre-registered comparison appended, none replaced.

    {"sweep": NAME, "stages": [STAGE, ...]}

A stage is a dict with ``stage`` (plan: the plan recorded by ``minillm-plan PLAN.yaml``; freeze: the design fixed
from the pilot by ``minillm-plan freeze``), ``version`` (1 for the first plan; each ``--force`` records the next),
and ``previous_sha256``: the sha256 of the stage before it (its canonical JSON, previous_sha256 included), null for
the first. A stage edited, removed or reordered breaks the chain (``chain_intact``). The current version is the last
plan stage with the freeze stages that follow it.

A plan.json written before the stages (one flat record: plan, plan_text, plan_sha256, recorded_at, rules_version)
is read as it was written: it is one plan stage of version 1 with nothing before it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

PLAN_KEYS = ("plan", "plan_sha256", "recorded_at", "plan_text")
STAGES = ("plan", "freeze")


class PlanError(ValueError):
    """A plan that cannot be recorded or read; the message names the file and the field."""


def number(value: Any) -> float | None:
    """A YAML number (PyYAML reads 3e-3 as text) or None."""
    if isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def parse_time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def stage_sha256(stage: Mapping) -> str:
    """The hash the next stage records: of the stage's canonical JSON (sorted keys, no spaces)."""
    return sha256(json.dumps(stage, sort_keys=True, separators=(",", ":"), default=str))


def staged(record: Mapping) -> bool:
    return isinstance(record.get("stages"), list)


def stages_of(record: Mapping) -> list[dict]:
    """The record's stages; a flat record (written before the stages) is one plan stage of version 1."""
    if staged(record):
        return list(record["stages"])
    return [{**record, "stage": "plan", "version": 1, "previous_sha256": None}]


def append(record: Mapping | None, sweep: str, stage: Mapping) -> dict:
    """The record with ``stage`` appended (``previous_sha256`` set); a flat record becomes its first stage."""
    before = stages_of(record) if record is not None else []
    entry = {**stage, "previous_sha256": stage_sha256(before[-1]) if before else None}
    return {"sweep": sweep, "stages": [*before, entry]}


def chain_intact(record: Mapping) -> bool:
    """Every stage records the hash of the one before it (a flat record has no chain to break)."""
    stages = stages_of(record)
    pairs = zip(stages, stages[1:], strict=False)
    return stages[0].get("previous_sha256") is None and all(
        later.get("previous_sha256") == stage_sha256(earlier) for earlier, later in pairs)


def current(record: Mapping) -> tuple[dict, dict | None]:
    """(the current plan stage, its freeze stage or None): the last plan stage and the last freeze after it."""
    stages = stages_of(record)
    last = max(i for i, s in enumerate(stages) if s.get("stage") == "plan")
    frozen = [s for s in stages[last + 1:] if s.get("stage") == "freeze"]
    return stages[last], (frozen[-1] if frozen else None)


def check(record: Any, path: Any) -> dict:
    """The record if it is one minillm-plan wrote, else PlanError naming the file."""
    if not isinstance(record, dict):
        raise PlanError(f"{path}: not a plan.json written by minillm-plan")
    stages = stages_of(record)
    if not stages or not all(isinstance(s, dict) and s.get("stage") in STAGES for s in stages) or (
            stages[0]["stage"] != "plan" or not all(k in s for s in stages if s["stage"] == "plan" for k in PLAN_KEYS)):
        raise PlanError(f"{path}: not a plan.json written by minillm-plan")
    return record
