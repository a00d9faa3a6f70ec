"""Calibration: `python train.py` (Lightning + Hydra) vs the plain loop of plain_loop.py, same settings.

Both: Pre-LN LayerNorm (norm=layernorm; EXPERIMENTS.md's baseline), the default model, data windows, seed
1337, AdamW groups, warmup + cosine schedule and clipping, shortened to MAX_STEPS steps (CPU time), val at
MAX_STEPS/2 and MAX_STEPS on the same 256 val windows. train.py runs with its default callbacks and
`logger=csv`, test=false. Runs in the order A-B-B-A (train.py, plain, plain, train.py) on a shared CPU;
tokens/s is the mean per arm (train time without validation).

    .venv/bin/python experiments/calibration/run.py        # ~5-7 min on 2 shared CPU cores
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

OUT = Path(__file__).parent
ROOT = OUT.parents[1]
sys.path.insert(0, str(OUT))
from plain_loop import RunConfig, train  # noqa: E402

MAX_STEPS = 300
TARGET = 0.03  # nats: |val loss difference| must stay below this (fixed before the runs)


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
    val, tr = [], []
    with open(run_dir / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("val/loss"):
                val.append((int(row["step"]), float(row["val/loss"])))
            if row.get("train/loss"):
                tr.append((int(row["step"]), float(row["train/loss"])))
    return dict(
        command=" ".join(["python"] + cmd[1:-1]),
        summary=summary,
        process_wall_s=time.time() - t,
        val_history=val,
        train_loss_logged=tr,
    )


ORDER = ("train_py", "plain", "plain", "train_py")  # A-B-B-A: a load drift on the shared CPU hits both arms


def main() -> None:
    torch.set_num_threads(1)  # 1, not 2: on the shared 2-core CPU 2 threads ran 6-8x slower (measured)
    lits, plains = [], []
    for arm in ORDER:
        if arm == "train_py":
            lit = run_train_py()
            lits.append(lit)
            s = lit["summary"]
            print("train.py", s["final_val_loss"], s["tokens_per_s"], lit["val_history"], flush=True)
        else:
            p = train(RunConfig(norm="layernorm", max_steps=MAX_STEPS, val_every=MAX_STEPS // 2))
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
