"""S6 (c): final val loss of layernorm vs rmsnorm at the default config, shortened budget, paired seeds.

Uses the reference loop of experiments.common.reference (a plain PyTorch loop over the composed configs/: the
same model, data windows, AdamW groups, schedule and clipping as `python train.py`; the calibration study checks
they agree). Both norms of one seed share the seed (init draws and data windows): a pair.

    # round 1: seeds 1337, 1 (4 runs, ~5 min) -> quality.json and quality_verdicts/ here
    .venv/bin/python -m experiments.studies.s6_cost.r1_cost.quality
    # round 2: 10 fresh pairs, ~15 min on 2 cores -> S6's r2_more_seeds/
    .venv/bin/python -m experiments.studies.s6_cost.r1_cost.quality --seeds 100 101 102 103 104 105 106 107 108 \\
        109 --jobs 2 --out experiments/studies/s6_cost/r2_more_seeds/quality.json
    R2=experiments/studies/s6_cost/r2_more_seeds/quality.json
    .venv/bin/python -m experiments.studies.s6_cost.r1_cost.quality --report $R2   # its table
    .venv/bin/python -m experiments.studies.s6_cost.r1_cost.quality --reanalyze $R2
        # the analysis again from the committed runs (no training): rewrites the JSON's analysis fields and the
        # quality_verdicts/ folder beside it (the same for round 1's quality.json)

Round 1's rule (fixed before its runs): |mean(rmsnorm) - mean(layernorm)| <= the larger seed range of the two
arms counts as "within seed noise". Round 2's rule (fixed before its runs, in this file): the paired
differences d = rmsnorm - layernorm, their mean and its 95% t-interval; **parity** when the whole interval lies
inside +-MARGIN nats, **a difference** when it excludes zero (its sign says which norm is better; both when a
difference too small to matter lies inside the margin), **inconclusive** otherwise.

The statistics are minillm.analysis.stats': paired_t (the interval, also given to round 1's two pairs, where it decides
nothing), verdict (round 2's rule is its equivalent / better / worse / inconclusive, in this study's words:
PARITY_WORDS) and sign_test. ``<result>_verdicts/`` holds minillm.analysis.compare's verdicts.json / .md / .png for the
round, what `minillm-report --compare norm --baseline layernorm` gives for these runs.
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

from minillm.analysis import stats as st
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_BEFORE

OUT = Path(__file__).parent

NORMS = ("layernorm", "rmsnorm")
SEEDS = (1337, 1)
MAX_STEPS = 300  # shortened from the default 1600 (CPU time); warmup 100, cosine over 300 steps
MARGIN = 0.02  # nats: round 2's equivalence margin (about 1% of the step-300 loss), fixed before its runs
LR = 3e-3  # the peak lr every quality run trained at (the default config's); recorded in runs from now on
# round 2's words for the engine's verdicts (minillm.analysis.stats.verdict, the same rule)
PARITY_WORDS = {"equivalent": "parity", "better": "difference: rmsnorm better", "worse": "difference: layernorm better",
                "inconclusive": "inconclusive"}


def run_one(norm: str, seed: int) -> dict:
    import torch

    from experiments.common.reference import compose, train

    torch.set_num_threads(1)  # 1, not 2: on the shared 2-core CPU 2 threads ran 6-8x slower (measured)
    r = train(compose(f"norm={norm}", f"seed={seed}", f"trainer.max_steps={MAX_STEPS}",
                      f"trainer.val_check_interval={MAX_STEPS // 2}"))
    return dict(norm=norm, seed=seed, lr=LR, final_val_loss=r["final_val_loss"],
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
    t = st.paired_t(by["rmsnorm"], by["layernorm"])
    engine = st.verdict(t["ci_low"], t["ci_high"], MARGIN)
    res.update(paired_t=t, engine_verdict=engine)
    if len(seeds) > 2:  # round 2's rule
        verdict = PARITY_WORDS[engine]
        if engine == "equivalent" and st.significant(t["ci_low"], t["ci_high"]):
            verdict += f" (a difference inside the margin: {'rmsnorm' if t['ci_high'] < 0 else 'layernorm'} better)"
        sign = st.sign_test(by["rmsnorm"], by["layernorm"])
        res.update(paired_ci95=[t["ci_low"], t["ci_high"]], margin=MARGIN, verdict=verdict,
                   rmsnorm_better_in=sign["lower"], sign_test_p=sign["p"])
    return res


def verdicts(res: dict) -> dict:
    """minillm.analysis.compare's verdicts.json for the runs of a result: RMSNorm against LayerNorm, margin MARGIN."""
    return compare([{"lr": LR, "max_steps": res.get("max_steps", MAX_STEPS), **r} for r in res["runs"]], "norm",
                   "layernorm", margin=MARGIN, lr=LR, **REGISTERED_BEFORE)


def write_result(res: dict, path: Path) -> None:
    """The result JSON and, beside it, ``<stem>_verdicts/`` (verdicts.json, .md, .png)."""
    from minillm.analysis.verdict_files import write

    path.write_text(json.dumps(res, indent=1))
    write(verdicts(res), path.with_name(f"{path.stem}_verdicts"))


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
                     f"margin +-{res['margin']}: **{res['verdict']}** (engine: {res['engine_verdict']}). RMSNorm "
                     f"lower in {res['rmsnorm_better_in']} of {len(res['seeds'])} pairs (sign test p = "
                     f"{res['sign_test_p']:.2f}); seed sd {res['std']['layernorm']:.4f} (layernorm), "
                     f"{res['std']['rmsnorm']:.4f} (rmsnorm).")
    elif res.get("paired_t", {}).get("ci_low") is not None:
        t = res["paired_t"]
        lines.append(f"Paired t interval (not this round's rule) {t['diff']:+.4f} nats, 95% CI [{t['ci_low']:+.4f}, "
                     f"{t['ci_high']:+.4f}] over {t['n']} pairs: {res['engine_verdict']} at margin +-{MARGIN}.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--jobs", type=int, default=1, help="processes (one thread each); a pair's two runs side by side")
    ap.add_argument("--out", type=Path, help="the result JSON (default: quality.json; with --reanalyze: the JSON read)")
    ap.add_argument("--report", type=Path, metavar="JSON", help="print the table of a written result")
    ap.add_argument("--reanalyze", type=Path, metavar="JSON", help="analyze a written result's runs again (no "
                    "training) and rewrite it (to --out when given) with its _verdicts/ folder")
    args = ap.parse_args(argv)
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return
    if args.reanalyze:
        res = json.loads(args.reanalyze.read_text())
        res.update(analyze(res["runs"], res["seeds"]))
        write_result(res, args.out or args.reanalyze)
        print(report(res))
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
    write_result(res, args.out or OUT / "quality.json")
    print(report(res))


if __name__ == "__main__":
    main()
