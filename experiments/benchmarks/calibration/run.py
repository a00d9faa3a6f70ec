"""Calibration: `python train.py` (Lightning + Hydra) vs the reference loop (experiments.common.reference: a plain
PyTorch loop over the same composed configs/), same settings.

Both: Pre-LN LayerNorm (norm=layernorm: the baseline the studies compare against), the default model, data windows, seed
1337, AdamW groups, warmup + cosine schedule and clipping, shortened to MAX_STEPS steps (CPU time), val at
MAX_STEPS/2 and MAX_STEPS on the same 256 val windows. train.py runs with its default callbacks and
`logger=csv`, test=false. Runs in the order A-B-B-A (train.py, plain, plain, train.py) on a shared CPU;
tokens/s is the mean per arm (train time without validation).

    .venv/bin/python -m experiments.benchmarks.calibration.run             # ~5-7 min on 2 shared CPU cores
    .venv/bin/python -m experiments.benchmarks.calibration.run --check 20  # seconds: the reference loop's
                                                                           # first 20 losses against the committed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from experiments.common.layout import ROOT
from experiments.common.reference import compose, train
from minillm.analysis.runs import read_curves
from minillm.metrics import TRAIN_LOSS, VAL_LOSS

OUT = Path(__file__).parent

MAX_STEPS = 300
TARGET = 0.03  # nats: |val loss difference| must stay below this (fixed before the runs)
CHECK_TOL = 1e-5  # nats: --check's tolerance (fp32 rounding; train.py and the plain loop agree to 4e-4)
PLAIN = ("norm=layernorm", f"trainer.max_steps={MAX_STEPS}", f"trainer.val_check_interval={MAX_STEPS // 2}")


def run_train_py() -> dict:
    run_dir = ROOT / "logs" / "calibration" / time.strftime("%Y%m%d-%H%M%S")
    cmd = [
        sys.executable,
        "train.py",
        "norm=layernorm",
        "logger=csv",
        f"trainer.max_steps={MAX_STEPS}",
        f"trainer.val_check_interval={MAX_STEPS // 2}",
        "test=false",
        "name=calibration",
        f"hydra.run.dir={run_dir}",
    ]
    t = time.time()
    subprocess.run(
        cmd,
        cwd=ROOT,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    curves = read_curves(run_dir / "csv" / "metrics.csv")
    val, tr = curves.get(VAL_LOSS, []), curves.get(TRAIN_LOSS, [])
    return dict(
        command=" ".join(["python"] + cmd[1:-1]),
        summary=summary,
        process_wall_s=time.time() - t,
        val_history=val,
        train_loss_logged=tr,
    )


ORDER = ("train_py", "plain", "plain", "train_py")  # A-B-B-A: a load drift on the shared CPU hits both arms


def check(steps: int) -> None:
    """The reference arm's first ``steps`` train losses (and its val losses among them) against those of the
    committed results.json: equal up to fp32 rounding (CHECK_TOL), or exit 1."""
    committed = json.loads((OUT / "results.json").read_text())["plain"]
    r = train(compose(*PLAIN), stop_after=steps)["history"]
    diffs = [abs(a - b) for a, b in zip(r["train_loss"], committed["train_loss"][:steps], strict=True)]
    val = dict(map(tuple, committed["val_history"]))
    for s, v in zip(r["val_step"], r["val_loss"], strict=True):
        diffs.append(abs(v - val[s]))
        print(f"val loss at step {s}: {v:.6f} (committed {val[s]:.6f})")
    drift = next((i + 1 for i, d in enumerate(diffs[:steps]) if d > 1e-6), None)
    print(f"reference loop, {steps} steps: max |difference| from the committed losses {max(diffs):.3g}, "
          f"{sum(d == 0 for d in diffs)} of {len(diffs)} bit-identical, first train loss off by > 1e-6: "
          f"{'none' if drift is None else f'step {drift}'}; tolerance {CHECK_TOL:g}")
    if max(diffs) > CHECK_TOL:
        sys.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", type=int, metavar="STEPS", help="only compare the reference loop's first STEPS "
                                                              "train losses with the committed ones")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # 1, not 2: on the shared 2-core CPU 2 threads ran 6-8x slower (measured)
    if args.check:
        return check(args.check)
    lits, plains = [], []
    for arm in ORDER:
        if arm == "train_py":
            lit = run_train_py()
            lits.append(lit)
            s = lit["summary"]
            print("train.py", s["final_val_loss"], s["tokens_per_s"], lit["val_history"], flush=True)
        else:
            p = train(compose(*PLAIN))
            p.pop("model")
            plains.append(p)
            print("plain", p["final_val_loss"], p["tokens_per_s"], flush=True)
    lit, plain, s = lits[0], plains[0], lits[0]["summary"]
    res = dict(
        max_steps=MAX_STEPS,
        target=TARGET,
        order=ORDER,
        train_py=lit,
        plain=dict(
            val_history=list(zip(plain["history"]["val_step"], plain["history"]["val_loss"], strict=True)),
            train_loss=plain["history"]["train_loss"],
        ),
    )
    # CSV rows carry the 0-based step of the batch; plain_tr[k] is the loss of 0-based step k
    plain_tr = plain["history"]["train_loss"]
    pairs = [(st, v, plain_tr[st]) for st, v in lit["train_loss_logged"] if st < len(plain_tr)]
    res["train_loss_max_abs_diff"] = max(abs(a - b) for _, a, b in pairs) if pairs else None
    res["final_val_loss"] = dict(
        train_py=[x["summary"]["final_val_loss"] for x in lits],
        plain=[x["final_val_loss"] for x in plains],
        diff=s["final_val_loss"] - plain["final_val_loss"],
    )
    res["within_target"] = abs(res["final_val_loss"]["diff"]) < TARGET
    tp_lit = [x["summary"]["tokens_per_s"] for x in lits]
    tp_plain = [x["tokens_per_s"] for x in plains]
    res["tokens_per_s"] = dict(
        train_py=tp_lit,
        plain=tp_plain,
        ratio_train_py_over_plain=(sum(tp_lit) / len(tp_lit)) / (sum(tp_plain) / len(tp_plain)),
    )
    print(json.dumps({k: v for k, v in res.items() if k not in ("train_py", "plain")}, indent=1), flush=True)
    (OUT / "results.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
