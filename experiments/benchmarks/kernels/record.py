"""Which run measured a row. Every row of the kernel benchmark carries the record of the process that measured it
(``run``: id, date, device, commit, kernel code, command), so a report never puts rows of two runs, or of two
versions of the kernels, side by side without saying so (report.py names each row's run and compares only rows of
one run). Imports only the standard library (report.py and merge.py run without torch).

Rows written before rows carried a record stand in for it with what they hold: the copy bandwidth their process
measured at its start (each process measures its own, so it tells the processes apart), the rest "unrecorded".
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
KERNEL_SOURCES = ("minillm/kernels/rmsnorm.py", "minillm/kernels/rmsnorm_triton.py", "minillm/kernels/add_rmsnorm.py")
UNRECORDED = "unrecorded"


def kernel_code() -> str:
    """A hash of minillm's kernel sources (12 hex digits): rows of two versions of the kernels differ here, whether
    or not the checkout has git."""
    digest = hashlib.sha256()
    for name in KERNEL_SOURCES:
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    return digest.hexdigest()[:12]


def run_record(device: str, command: str) -> dict:
    """The record every row of this process carries."""
    from experiments.common.machine import this_checkout

    return {"id": f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "device": device, "commit": this_checkout(), "kernel_code": kernel_code(), "command": command}


def run_of(row: dict) -> dict:
    """The record of the run that measured a row (a stand-in for rows from before the records: module docstring)."""
    if isinstance(row.get("run"), dict):
        return row["run"]
    copy = row.get("copy_gbps")
    return {"id": f"copy {copy:.3f} GB/s" if copy else UNRECORDED, "date": None, "device": None, "commit": None,
            "kernel_code": None, "command": None}


def runs(rows: list[dict], known: list[dict] = ()) -> dict[str, dict]:
    """{run id: record with its label R1, R2, ... (by date; undated runs last) and its row count}. ``known``: the
    report's list of merged runs ({date, copy_gbps}), which dates an older run by its copy bandwidth."""
    dated = {round(r["copy_gbps"], 3): r.get("date") for r in known if r.get("copy_gbps")}
    found: dict[str, dict] = {}
    for row in rows:
        rec = run_of(row)
        entry = found.setdefault(rec["id"], {**rec, "rows": 0})
        entry["rows"] += 1
        if entry.get("date") is None and "run" not in row and row.get("copy_gbps"):
            entry["date"] = dated.get(round(row["copy_gbps"], 3))
    ordered = sorted(found.values(), key=lambda r: (r.get("date") is None, r.get("date") or "", r["id"]))
    return {r["id"]: {**r, "label": f"R{i}"} for i, r in enumerate(ordered, 1)}


def label(report_runs: dict[str, dict], row: dict) -> str:
    return report_runs[run_of(row)["id"]]["label"]
