"""A study round prepared for one CUDA GPU: stages of train.py runs, each with a time limit, a stage after the
first run only when its gate (a reading of the stage before) holds, and a dry run that builds every run's config
on any machine (CPU included), counts the runs, their parameters and tokens per parameter, and checks that the
stages' limits fit the round's budget.

    python -m experiments.studies.<study>.<round>.plan --dry-run     # any machine: every config built and counted
    python -m experiments.studies.<study>.<round>.plan --out DIR     # a CUDA machine: the stages, then the analysis

The time of a run is estimated at ``TOKENS_PER_S`` (the budget's assumption, stated in each round's README); each
stage runs under its own limit whatever the estimate said, and a stage cut short is written as such.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from experiments.common.reference import compose

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 540  # the whole GPU command: 9 minutes
STARTUP_S = 15  # per run: Python, the data store, the model (no compile: model.compile stays false)


@dataclass
class Stage:
    """Runs of train.py (one list of overrides each), run one after another within ``limit_s`` seconds."""

    name: str
    runs: list[list[str]]
    limit_s: int
    tokens_per_s: float  # the assumed throughput of one run on the GPU (the estimate, not a limit)
    gate: Callable[[Path], dict] | None = None  # reads this stage's run folders: {"status": "present" | ..., ...}
    notes: list[str] = field(default_factory=list)


def describe(stage: Stage) -> list[dict]:
    """Each run of the stage composed as train.py would compose it: its model built on the meta device."""
    import torch

    from minillm.model import Transformer
    from minillm.training.run.build import model_config

    out = []
    for overrides in stage.runs:
        cfg = compose(*overrides)
        vocab = 88 if cfg.data.tokenizer == "char" else int(cfg.data.vocab_size)  # Shakespeare's characters
        with torch.device("meta"):
            n_params = Transformer(model_config(cfg, vocab)).num_params()
        tokens = int(cfg.trainer.max_steps) * int(cfg.data.batch_size) * int(cfg.model.max_seq_len)
        out.append({"overrides": overrides, "n_params": n_params, "tokens": tokens,
                    "tokens_per_param": tokens / n_params,
                    "estimate_s": STARTUP_S + tokens / stage.tokens_per_s})
    return out


def dry_run(stages: Sequence[Stage], budget_s: int) -> dict:
    """Every run built and counted; the stages' limits against the round's budget."""
    described = {s.name: describe(s) for s in stages}
    summary = {s.name: {"runs": len(s.runs), "limit_s": s.limit_s,
                        "estimate_s": round(sum(r["estimate_s"] for r in described[s.name])),
                        "n_params": sorted({r["n_params"] for r in described[s.name]}),
                        "tokens_per_param": sorted({round(r["tokens_per_param"], 2) for r in described[s.name]})}
               for s in stages}
    total = sum(s.limit_s for s in stages)
    fits = total <= budget_s and all(v["estimate_s"] <= v["limit_s"] for v in summary.values())
    return {"stages": summary, "runs": sum(len(s.runs) for s in stages), "limit_s": total, "budget_s": budget_s,
            "fits": fits}


def run_stage(stage: Stage, out: Path, deadline: float) -> dict:
    """The stage's runs, one after another, each in out/<stage>/<i>, stopped at the stage's limit or the deadline."""
    folder = out / stage.name
    folder.mkdir(parents=True, exist_ok=True)
    ends = min(time.monotonic() + stage.limit_s, deadline)
    done, cut = 0, False
    for i, overrides in enumerate(stage.runs):
        left = ends - time.monotonic()
        if left <= 0:
            cut = True
            break
        cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={folder / str(i)}",
               f"paths.log_dir={folder / 'logs'}"]
        try:
            subprocess.run(cmd, cwd=ROOT, timeout=left, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            done += 1
        except subprocess.TimeoutExpired:
            cut = True
            break
    return {"runs": len(stage.runs), "completed": done, "cut_short": cut}


def main(doc: str, here: Path, stages: Sequence[Stage], analyze: Callable[[Path], dict],
         argv: Sequence[str] | None = None, budget_s: int = BUDGET_S) -> int:
    """The round's command: ``--dry-run`` prints the plan (exit 1 when it does not fit); otherwise the stages in
    order on the GPU, each gate read before the next stage, then ``analyze`` of the run folders, into --out."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="build and count every run's config; train nothing")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/minillm-gpu")) / here.name)
    args = p.parse_args(argv)
    if args.dry_run:
        plan = dry_run(stages, budget_s)
        print(json.dumps(plan, indent=1))
        return 0 if plan["fits"] else 1
    import torch

    if not torch.cuda.is_available():
        print(f"{here.name}: needs a CUDA GPU (--dry-run builds the plan on any machine)", file=sys.stderr)
        return 2
    deadline = time.monotonic() + budget_s
    record: dict = {"stages": {}, "gates": {}}
    for stage in stages:
        record["stages"][stage.name] = run_stage(stage, args.out, deadline)
        if stage.gate is not None:
            gate = stage.gate(args.out / stage.name)
            record["gates"][stage.name] = gate
            if gate.get("status") != "present":
                record["stopped"] = f"the gate after {stage.name} reads {gate.get('status')}: later stages not run"
                break
    record["analysis"] = analyze(args.out)
    (args.out / "plan_record.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(json.dumps(record, indent=1, default=str))
    return 0
