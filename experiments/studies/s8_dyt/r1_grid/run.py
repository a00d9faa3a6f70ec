"""S8's runs: the DyT grid and the RMSNorm baseline at 400 steps (two processes at a time), then the 1600-step
runs of the best alpha0 at lr 3e-3 beside RMSNorm, then the analysis. ~17 min on 2 cores.

    python -m experiments.studies.s8_dyt.r1_grid.run                 # sweeps into logs/s8_dyt/multiruns/<stage>_<time>
    python -m experiments.studies.s8_dyt.r1_grid.run --dry-run       # print the commands only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence

from experiments.common.layout import ROOT
from experiments.common.study import load
from experiments.studies.s8_dyt.r1_grid import analyze


def csv(values: Sequence[float | int]) -> str:
    return ",".join(f"{v:g}" for v in values)


def sweep(stage: str, stamp: str, *overrides: str, jobs: int = 2) -> tuple[list[str], str]:
    folder = f"logs/s8_dyt/multiruns/{stage}_{stamp}"
    return ([sys.executable, "train.py", "-m", "experiment=s8_dyt", "hydra/launcher=joblib",
             f"hydra.launcher.n_jobs={jobs}", f"hydra.sweep.dir={folder}", *overrides], folder)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    seeds, lrs = f"seed={csv(analyze.SEEDS)}", f"optimizer.lr={csv(analyze.LRS)}"
    grid = sweep("grid", stamp, "norm=dyt", f"model.norm_options.alpha0={csv(analyze.ALPHA0)}", lrs, seeds)
    base = sweep("baseline", stamp, "norm=rmsnorm", lrs, seeds)
    for cmd, _ in (grid, base):
        print(" ".join(cmd[1:]), flush=True)
        if not args.dry_run:
            subprocess.run(cmd, cwd=ROOT, check=True)
    a0 = 1.0 if args.dry_run else None
    if a0 is None:
        runs = load(analyze.HERE, [ROOT / grid[1], ROOT / base[1]], lambda k: False, out=ROOT / "logs" / "s8_dyt")
        a0 = min(analyze.ALPHA0, key=lambda a: analyze.mean(
            analyze.cell(runs, "dyt", analyze.LONG_LR, analyze.SHORT, a).values()))
    long = [f"trainer.max_steps={analyze.LONG}", f"optimizer.lr={analyze.LONG_LR:g}", seeds]
    longs = [sweep("long_dyt", stamp, "norm=dyt", f"model.norm_options.alpha0={a0:g}", *long, jobs=1),
             sweep("long_rmsnorm", stamp, "norm=rmsnorm", *long, jobs=1)]
    for cmd, _ in longs:
        print(" ".join(cmd[1:]), flush=True)
    if args.dry_run:
        return
    procs = [subprocess.Popen(cmd, cwd=ROOT) for cmd, _ in longs]  # side by side, one job each
    if any(p.wait() for p in procs):
        sys.exit("a 1600-step sweep failed")
    analyze.main([str(ROOT / f) for _, f in (grid, base, *longs)])


if __name__ == "__main__":
    main()
