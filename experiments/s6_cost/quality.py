"""S6 (c): final val loss of layernorm vs rmsnorm at the default config, shortened budget, paired seeds.

Uses the reference loop of experiments.common.reference (a plain PyTorch loop over the composed configs/: the
same model, data windows, AdamW groups, schedule and clipping as `python train.py`; the calibration study checks
they agree). Both norms of one seed share the seed (init draws and data windows): a pair.

    .venv/bin/python -m experiments.s6_cost.quality        # round 1: seeds 1337, 1 (4 runs, ~5 min) -> quality.json
    .venv/bin/python -m experiments.s6_cost.quality --seeds 100 101 102 103 104 105 106 107 108 109 --jobs 2 \\
        --out experiments/s6_cost/quality_seeds10.json      # round 2: 10 fresh pairs, ~15 min on 2 cores
    .venv/bin/python -m experiments.s6_cost.quality --report experiments/s6_cost/quality_seeds10.json

Round 1's rule (fixed before its runs): |mean(rmsnorm) - mean(layernorm)| <= the larger seed range of the two
arms counts as "within seed noise". Round 2's rule (fixed before its runs, in this file): the paired
differences d = rmsnorm - layernorm, their mean and its 95% t-interval; **parity** when the whole interval lies
inside +-MARGIN nats, **a difference** when it excludes zero (its sign says which norm is better; both when a
difference too small to matter lies inside the margin), **inconclusive** otherwise.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from scipy import stats

OUT = Path(__file__).parent

NORMS = ("layernorm", "rmsnorm")
SEEDS = (1337, 1)
MAX_STEPS = 300  # shortened from the default 1600 (CPU time); warmup 100, cosine over 300 steps
MARGIN = 0.02  # nats: round 2's equivalence margin (about 1% of the step-300 loss), fixed before its runs


def run_one(norm: str, seed: int) -> dict:
    import torch

    from experiments.common.reference import compose, train

    torch.set_num_threads(1)  # 1, not 2: on the shared 2-core CPU 2 threads ran 6-8x slower (measured)
    r = train(compose(f"norm={norm}", f"seed={seed}", f"trainer.max_steps={MAX_STEPS}",
                      f"trainer.val_check_interval={MAX_STEPS // 2}"))
    return dict(norm=norm, seed=seed, final_val_loss=r["final_val_loss"],
                val_history=list(zip(r["history"]["val_step"], r["history"]["val_loss"], strict=True)),
                tokens_per_s=r["tokens_per_s"])


def analyze(runs: list[dict], seeds: Sequence[int]) -> dict:
    """Both rules over the runs: round 1's seed-range rule and round 2's paired interval."""
    loss = {(r["norm"], r["seed"]): r["final_val_loss"] for r in runs}
    by = {n: [loss[n, s] for s in seeds] for n in NORMS}
    paired = np.array([loss["rmsnorm", s] - loss["layernorm", s] for s in seeds])
    diff = float(paired.mean())
    noise = max(float(np.ptp(v)) for v in by.values())
    res = dict(mean={n: float(np.mean(v)) for n, v in by.items()}, std={n: float(np.std(v, ddof=1)) for n, v in
               by.items()}, diff_rms_minus_ln=diff, paired_diffs=paired.tolist(), seed_range=noise,
               parity=bool(abs(diff) <= noise))
    if len(seeds) > 2:
        half = float(stats.t.ppf(0.975, len(seeds) - 1) * paired.std(ddof=1) / np.sqrt(len(seeds)))
        low, high = diff - half, diff + half
        excludes_zero = low > 0 or high < 0
        better = f"{'rmsnorm' if high < 0 else 'layernorm'} better"
        if -MARGIN < low and high < MARGIN:
            verdict = f"parity (a difference inside the margin: {better})" if excludes_zero else "parity"
        else:
            verdict = f"difference: {better}" if excludes_zero else "inconclusive"
        res.update(paired_ci95=[low, high], margin=MARGIN, verdict=verdict,
                   rmsnorm_better_in=int((paired < 0).sum()),
                   sign_test_p=float(stats.binomtest(int((paired < 0).sum()), len(seeds)).pvalue))
    return res


def report(res: dict) -> str:
    rows = ["| seed | layernorm | rmsnorm | rmsnorm - layernorm |", "|---|---|---|---|"]
    loss = {(r["norm"], r["seed"]): r["final_val_loss"] for r in res["runs"]}
    for s in res["seeds"]:
        rows.append(f"| {s} | {loss['layernorm', s]:.4f} | {loss['rmsnorm', s]:.4f} | "
                    f"{loss['rmsnorm', s] - loss['layernorm', s]:+.4f} |")
    rows.append(f"| **mean** | **{res['mean']['layernorm']:.4f}** | **{res['mean']['rmsnorm']:.4f}** | "
                f"**{res['diff_rms_minus_ln']:+.4f}** |")
    lines = [*rows, ""]
    if "paired_ci95" in res:
        low, high = res["paired_ci95"]
        lines.append(f"Paired difference {res['diff_rms_minus_ln']:+.4f} nats, 95% CI [{low:+.4f}, {high:+.4f}], "
                     f"margin +-{res['margin']}: **{res['verdict']}**. RMSNorm lower in {res['rmsnorm_better_in']}"
                     f" of {len(res['seeds'])} pairs (sign test p = {res['sign_test_p']:.2f}); seed sd "
                     f"{res['std']['layernorm']:.4f} (layernorm), {res['std']['rmsnorm']:.4f} (rmsnorm).")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--jobs", type=int, default=1, help="processes (one thread each); a pair's two runs side by side")
    ap.add_argument("--out", type=Path, default=OUT / "quality.json")
    ap.add_argument("--report", type=Path, metavar="JSON", help="print the table of a written result")
    args = ap.parse_args(argv)
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return
    t0 = time.time()
    tasks = [(norm, seed) for seed in args.seeds for norm in NORMS]  # interleaved: load hits both arms alike
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_one, *t) for t in tasks]
        runs = []
        for f in futures:
            runs.append(f.result())
            r = runs[-1]
            print(f"{r['norm']} seed {r['seed']}: val {r['final_val_loss']:.4f}, {r['tokens_per_s']:.0f} tok/s "
                  f"({time.time() - t0:.0f}s)", flush=True)
    from experiments.common.machine import machine

    res = dict(machine=machine(), max_steps=MAX_STEPS, seeds=args.seeds, runs=runs, **analyze(runs, args.seeds),
               seconds=round(time.time() - t0, 1))
    args.out.write_text(json.dumps(res, indent=1))
    print(report(res))


if __name__ == "__main__":
    main()
