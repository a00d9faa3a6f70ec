"""Independent calibration: `python train.py` against nanogpt_loop.py, a model and loop that import nothing from
minillm, on the same text (minillm's Shakespeare corpus written out once as a UTF-8 file).

Both arms run the default recipe (dim 128, 4 layers, 1,600 steps of batch 32, AdamW 3e-3, warmup 100 + cosine
to 0.1x, clipping 1.0, fp32) for each seed, one train.py and one nanogpt_loop process at a time side by side
(one thread each). The compared number is the loss on the whole held-out split (train.py's test/loss, the
loop's own evaluation of the last 10% of the characters).

Criterion, fixed before the runs: |mean test loss of train.py - mean test loss of the loop| < TARGET nats
over SEEDS. The seeds' spread is reported beside it (the two arms draw different windows and init values, so
a seed of one arm is not paired with the same seed of the other), and, beside the criterion without deciding
anything, Welch's 95% interval of the difference with the engine's word for it at the margin TARGET
(minillm.analysis.stats.welch_t, verdict).

    .venv/bin/python -m experiments.benchmarks.calibration.independent             # ~25 min on 2 cores
    .venv/bin/python -m experiments.benchmarks.calibration.independent --report    # tables from the committed JSON
    # judge the committed runs again (no training)
    .venv/bin/python -m experiments.benchmarks.calibration.independent --rejudge
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from experiments.common.layout import ROOT
from experiments.common.machine import machine
from minillm.analysis import stats as st

OUT = Path(__file__).parent
RESULTS = OUT / "independent.json"
TARGET = 0.03  # nats, fixed before the runs
SEEDS = (1337, 1338, 1339)


def corpus_file(work: Path) -> Path:
    """minillm's Shakespeare text (Gutenberg boilerplate removed, documents joined by blank lines) as a file."""
    from minillm.training.data.corpus import load_shakespeare

    path = work / "shakespeare.txt"
    if not path.exists():
        path.write_text(load_shakespeare(), encoding="utf-8")
    return path


def run_pair(seed: int, text: Path, work: Path) -> dict:
    """train.py and nanogpt_loop.py with one seed, side by side, one thread each."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log_dir = work / "minillm"
    lit_cmd = [sys.executable, "train.py", f"seed={seed}", "logger=csv", "name=calibration_independent",
               f"paths.log_dir={log_dir}"]
    loop_out = work / f"loop_{seed}.json"
    loop_cmd = [sys.executable, str(OUT / "nanogpt_loop.py"), "--text", str(text), "--seed", str(seed),
                "--out", str(loop_out)]
    before = set(log_dir.glob("calibration_independent/runs/*"))
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for cmd in (lit_cmd, loop_cmd)]
    for cmd, p in zip((lit_cmd, loop_cmd), procs, strict=True):
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"{' '.join(cmd[1:])} failed (exit {p.returncode}):\n{err[-2000:]}")
    (run_dir,) = set(log_dir.glob("calibration_independent/runs/*")) - before
    summary = json.loads((run_dir / "summary.json").read_text())
    loop = json.loads(loop_out.read_text())
    return {"seed": seed,
            "train_py": {k: summary[k] for k in ("test_loss", "final_val_loss", "tokens_per_s", "vocab_size",
                                                   "n_params")},
            "loop": {k: loop[k] for k in ("test_loss", "tokens_per_s", "vocab", "n_params", "curve")}}


def judge(pairs: list[dict]) -> dict:
    lit = [p["train_py"]["test_loss"] for p in pairs]
    loop = [p["loop"]["test_loss"] for p in pairs]
    diff = statistics.mean(lit) - statistics.mean(loop)
    return {"train_py_mean": statistics.mean(lit), "loop_mean": statistics.mean(loop), "difference": diff,
            "train_py_seed_range": max(lit) - min(lit), "loop_seed_range": max(loop) - min(loop),
            "train_py_seed_sd": statistics.stdev(lit) if len(lit) > 1 else None,
            "loop_seed_sd": statistics.stdev(loop) if len(loop) > 1 else None,
            "within_target": abs(diff) < TARGET, "welch_t": (t := st.welch_t(lit, loop)),
            "engine_verdict": st.verdict(t["ci_low"], t["ci_high"], TARGET)}


def report(res: dict) -> str:
    v = res["verdict"]
    rows = ["| seed | train.py test/loss | nanogpt_loop test loss | train.py tokens/s | loop tokens/s |",
            "|---|---|---|---|---|"]
    for p in res["pairs"]:
        rows.append(f"| {p['seed']} | {p['train_py']['test_loss']:.4f} | {p['loop']['test_loss']:.4f} | "
                    f"{p['train_py']['tokens_per_s']:,.0f} | {p['loop']['tokens_per_s']:,.0f} |")
    rows.append(f"| **mean** | **{v['train_py_mean']:.4f}** | **{v['loop_mean']:.4f}** | | |")
    return "\n".join([
        f"Machine: {res['machine']}. Target |difference| < {res['target']} nats.", "", *rows, "",
        f"Difference of the means (train.py - loop): **{v['difference']:+.4f} nats**; seed ranges "
        f"{v['train_py_seed_range']:.4f} (train.py) and {v['loop_seed_range']:.4f} (loop); "
        f"{'within' if v['within_target'] else 'outside'} the target."
        + (f" Welch's 95% interval [{v['welch_t']['ci_low']:+.4f}, {v['welch_t']['ci_high']:+.4f}]: "
           f"{v['engine_verdict']} at the margin {res['target']} (minillm.analysis.stats; beside the criterion)."
           if v.get("welch_t", {}).get("ci_low") is not None else "")])


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", action="store_true", help="print the table of the committed results")
    ap.add_argument("--rejudge", action="store_true", help="judge the committed runs again (no training) and "
                    "rewrite the committed results")
    ap.add_argument("--work", type=Path, default=ROOT / "logs" / "calibration_independent",
                    help="where the text file and the runs go (git-ignored logs/ by default)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = ap.parse_args(argv)
    if args.report:
        print(report(json.loads(RESULTS.read_text())))
        return
    if args.rejudge:
        res = json.loads(RESULTS.read_text())
        res["verdict"] = judge(res["pairs"])
        RESULTS.write_text(json.dumps(res, indent=1) + "\n")
        print(report(res))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    text = corpus_file(args.work)
    pairs, start = [], time.time()
    for seed in args.seeds:
        pairs.append(run_pair(seed, text, args.work))
        p = pairs[-1]
        print(f"seed {seed}: train.py {p['train_py']['test_loss']:.4f}, loop {p['loop']['test_loss']:.4f} "
              f"({time.time() - start:.0f} s)", flush=True)
    res = {"machine": machine(), "target": TARGET, "seeds": args.seeds, "pairs": pairs, "verdict": judge(pairs),
           "wall_s": round(time.time() - start)}
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(report(res))


if __name__ == "__main__":
    main()
