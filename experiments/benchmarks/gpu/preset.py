"""Tokens/s and MFU of the default GPU preset (train.py trainer=gpu model=gpt125m), stability callbacks on and
off, eager and compiled: four short train.py runs, read back from their CSV logs.

    python -m experiments.benchmarks.gpu.preset --out DIR             # on the GPU (needs hydra, datasets, the corpus:
                                                           # bash scripts/setup.sh --offline wheelhouse first)
    python -m experiments.benchmarks.gpu.preset --out DIR --dry-run   # the same runs on the CPU, tiny model, few steps

Each run is `python train.py trainer=gpu model=gpt125m logger=csv` with validation, test, checkpoints, the
progress bar and the text sample off (they are not part of a training step), for --steps steps. "Stability off"
removes callbacks.stability and callbacks.divergence (StabilityMonitor and DivergenceGuard); PerfMonitor stays,
it is what measures: perf/tokens_per_s and perf/mfu every trainer.log_every_n_steps steps
(minillm/training/callbacks/perf.py:
FLOPs counted by FlopCounterMode, peak from Lightning's table). The first third of the logged intervals
(compilation, warm-up) is dropped and the median of the rest is reported. Writes DIR/preset.json and .md after
every run; a run that fails becomes an error row with the end of its log. Imports only the standard library.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.benchmarks.kernels.record import run_record
from experiments.common.failure import failure, tail
from experiments.common.layout import ROOT
from minillm.metrics import DATA_WAIT_FRAC, FLOPS_PER_S_DEVICE, MFU, TOKENS_PER_S, TRAIN_LOSS

COMMON = ["logger=csv", "+trainer.limit_val_batches=0", "test=false", "+trainer.enable_checkpointing=false",
          "~callbacks.model_checkpoint", "~callbacks.step_checkpoints", "~callbacks.progress_bar",
          "callbacks.text_sample.max_new_tokens=0"]
GPU = ["trainer=gpu", "model=gpt125m"]
DRY = ["trainer=cpu", "model=tiny", "data.batch_size=8"]
NO_STABILITY = ["~callbacks.stability", "~callbacks.divergence"]
METRICS = (TOKENS_PER_S, MFU, FLOPS_PER_S_DEVICE, DATA_WAIT_FRAC, TRAIN_LOSS)


def read_metrics(path: Path) -> dict:
    """Median of each metric over the last two thirds of its logged values (None when never logged)."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    out = {}
    for name in METRICS:
        vals = [float(r[name]) for r in rows if r.get(name) not in (None, "")]
        kept = vals[len(vals) // 3:]
        out[name] = statistics.median(kept) if kept else None
        out[name + ":n"] = len(kept)
    return out


def run_one(compiled: bool, stability: bool, steps: int, dry: bool, workdir: Path, timeout: int) -> dict:
    name = f"preset-{'compiled' if compiled else 'eager'}-stability-{'on' if stability else 'off'}"
    run_dir = workdir / name
    cmd = [sys.executable, str(ROOT / "train.py"), *(DRY if dry else GPU), *COMMON, f"trainer.max_steps={steps}",
           f"model.compile={str(compiled).lower()}", f"name={name}", f"hydra.run.dir={run_dir}",
           *([] if stability else NO_STABILITY)]
    row = {"compiled": compiled, "stability": stability, "steps": steps, "command": " ".join(cmd[1:]),
           "run": run_record(_device(), "python " + " ".join(cmd[1:]))}
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        row["wall_s"] = time.perf_counter() - t0
        if res.returncode != 0:  # minillm's one-line error is on stdout or stderr: keep the end of both
            last = (tail(res.stderr, 1) or tail(res.stdout, 1))[:300]
            row.update(error=f"exit {res.returncode}: {last}", stdout_tail=tail(res.stdout),
                       stderr_tail=tail(res.stderr))
        else:
            row.update(read_metrics(run_dir / "csv" / "metrics.csv"))
    except subprocess.TimeoutExpired as e:  # what the run printed before it was stopped
        row.update(error=f"timed out after {timeout} s", stdout_tail=tail(e.stdout), stderr_tail=tail(e.stderr))
    except Exception as e:  # a missing log: an error row, the other runs go on
        row.update(failure(e))
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# Default GPU preset: {meta['what']}", "", f"{meta['date']}; {meta['steps']} steps per run; medians "
             "of the last two thirds of the logged intervals. `run`: the date and commit of each train.py run (the "
             "command is in the JSON).", "",
             "| compiled | stability callbacks | run | tokens/s | MFU | data wait | wall s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        run = r.get("run") or {}
        when = f"{run.get('date', 'unrecorded')}, {run.get('commit', 'unrecorded')}"
        head = f"| {r['compiled']} | {r['stability']} | {when}"
        if "error" in r:
            lines.append(f"{head} | FAIL: {r['error'][-200:]!r} | | | |")
            continue
        tps, mfu, wait = r.get(TOKENS_PER_S), r.get(MFU), r.get(DATA_WAIT_FRAC)
        lines.append(f"{head} | {'n/a' if tps is None else f'{tps:.0f}'} | "
                     f"{'n/a' if mfu is None else f'{mfu:.1%}'} | {'n/a' if wait is None else f'{wait:.1%}'} | "
                     f"{r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "minillm_preset")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--dry-run", action="store_true", help="CPU, model=tiny: checks the commands, not the speed")
    p.add_argument("--timeout", type=int, default=150, help="seconds per train.py run")
    a = p.parse_args(argv)
    steps = min(a.steps, 20) if a.dry_run else a.steps
    a.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="minillm_preset_"))
    meta = {"what": "CPU dry run, model=tiny" if a.dry_run else "trainer=gpu model=gpt125m",
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": steps, "dry_run": a.dry_run, "device": _device()}
    rows = []
    for compiled in (True, False):
        for stability in (True, False):
            rows.append(run_one(compiled, stability, steps, a.dry_run, workdir, a.timeout))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "command"})[:600], flush=True)
            (a.out / "preset.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=1))
            (a.out / "preset.md").write_text(markdown(rows, meta))
    print(f"wrote {a.out / 'preset.json'} and preset.md")
    if any("error" in r for r in rows):  # the rows are written; the exit status says that some failed
        raise SystemExit(f"preset: {sum('error' in r for r in rows)} of {len(rows)} runs failed; see preset.md")
    return a.out / "preset.json"


def _device() -> str:
    """The CUDA device's name ("cpu" without one): merge.py refuses to put two devices' steps in one report."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    main()
