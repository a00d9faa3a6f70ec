"""S6 (a) op-level and (b) end-to-end cost of the norms on this CPU, timed interleaved in one run.

(a) forward and forward+backward time of minillm's layernorm, rmsnorm, batchnorm (per-position stats,
    train mode), none, and torch's nn.LayerNorm, nn.RMSNorm and F.rms_norm, at a few (tokens, hidden)
    shapes, fp32 and bf16. Every repetition runs every op once in a shuffled order (so load from other
    processes hits all of them alike); the table reports medians and ratios vs minillm's layernorm.
(b) train-step time (forward, backward, clip, AdamW) of the default model (dim 128, 4 layers, batch
    32 x 64, fp32) with layernorm vs rmsnorm, interleaved step blocks, median; tokens/s.

    .venv/bin/python -m experiments.studies.s6_cost.r1_cost.bench        # ~3 min on 2 shared CPU cores
"""

# ruff: noqa: B023  (the closures in the timing/eval loops are called at once, inside the loop)
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from experiments.common import reference
from experiments.common.machine import machine
from minillm.model import Transformer
from minillm.norms import build_norm

OUT = Path(__file__).parent

SHAPES = [
    (2048, 128),
    (2048, 512),
    (4096, 1024),
]  # (tokens, hidden); 2048 x 128 = the default model's norm input
BATCH = 32  # tokens = BATCH x T (batchnorm's per-position statistics need a (B, T, C) layout)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
REPS, ITERS = 15, 5
E2E_REPS, E2E_STEPS = 12, 3


def make_ops(C: int, T: int, dtype: torch.dtype) -> dict[str, nn.Module]:
    ops = {
        "layernorm": build_norm("layernorm", C, 1e-5),
        "rmsnorm": build_norm("rmsnorm", C, 1e-5),
        "batchnorm": build_norm("batchnorm", C, 1e-5, max_seq_len=T),
        "none": build_norm("none", C, 1e-5),
        "torch nn.LayerNorm": nn.LayerNorm(C, eps=1e-5),
        "torch nn.RMSNorm": nn.RMSNorm(C, eps=1e-5),
    }
    for m in ops.values():
        m.to(dtype)  # the parameters in the input dtype (minillm's norms still reduce in fp32)
    w = nn.Parameter(torch.ones(C, dtype=dtype))
    ops["torch F.rms_norm"] = lambda x: F.rms_norm(x, (C,), w, 1e-5)
    ops["_w"] = w
    return ops


def time_call(fn, iters: int) -> float:
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def op_level() -> list[dict]:
    rows = []
    for n_tok, C in SHAPES:
        for dname, dtype in DTYPES.items():
            T = n_tok // BATCH
            ops = make_ops(C, T, dtype)
            names = [k for k in ops if not k.startswith("_")]
            x = torch.randn(BATCH, T, C, dtype=dtype)
            xg = x.clone().requires_grad_(True)
            gy = torch.randn_like(x)
            params = [p for k in names if isinstance(ops[k], nn.Module) for p in ops[k].parameters()] + [
                ops["_w"]
            ]

            def fwd(op):
                with torch.no_grad():
                    op(x)

            def fwd_bwd(op):
                xg.grad = None
                for p in params:
                    p.grad = None
                y = op(xg)
                if y is xg:  # "none": the backward of identity is a copy of the incoming gradient
                    xg.grad = gy.clone()
                else:
                    y.backward(gy)

            for k in names:  # warm up
                fwd(ops[k]), fwd_bwd(ops[k])
            times = {(k, m): [] for k in names for m in ("fwd", "fwd_bwd")}
            for _ in range(REPS):
                order = names[:]
                random.shuffle(order)
                for k in order:
                    times[k, "fwd"].append(time_call(lambda: fwd(ops[k]), ITERS))
                    times[k, "fwd_bwd"].append(time_call(lambda: fwd_bwd(ops[k]), ITERS))
            base = {m: float(np.median(times["layernorm", m])) for m in ("fwd", "fwd_bwd")}
            for k in names:
                fwd_ms, fb_ms = (float(np.median(times[k, m])) * 1e3 for m in ("fwd", "fwd_bwd"))
                rows.append(
                    dict(
                        tokens=n_tok,
                        hidden=C,
                        dtype=dname,
                        op=k,
                        fwd_ms=fwd_ms,
                        fwd_bwd_ms=fb_ms,
                        fwd_vs_layernorm=fwd_ms / 1e3 / base["fwd"],
                        fwd_bwd_vs_layernorm=fb_ms / 1e3 / base["fwd_bwd"],
                    )
                )
            print(
                f"op-level {n_tok}x{C} {dname}: "
                + ", ".join(
                    f"{r['op']} {r['fwd_ms']:.3f}/{r['fwd_bwd_ms']:.3f}ms" for r in rows[-len(names) :]
                ),
                flush=True,
            )
    return rows


def end_to_end() -> dict:
    from hydra.utils import instantiate

    arms = {}
    for norm in ("layernorm", "rmsnorm"):
        cfg = reference.compose(f"norm={norm}")
        tr, _, vocab = reference.tokens(cfg)
        torch.manual_seed(0)
        model = Transformer(reference.model_config(cfg, vocab))
        opt = instantiate(cfg.optimizer, lr=1e-4)(reference.param_groups(cfg, model))  # constant lr, no schedule
        arms[norm] = (model, opt, reference.Loop.of(cfg))
    step_counter = {"n": 0}

    def step(model, opt, loop):
        x, y = reference.train_batch(tr, loop.data_seed, step_counter["n"], loop.batch_size, loop.seq_len)
        step_counter["n"] += 1
        reference.step(model, opt, None, x, y, loop.clip)

    for a in arms.values():
        step(*a)
    times = {k: [] for k in arms}
    for _ in range(E2E_REPS):
        order = list(arms)
        random.shuffle(order)
        for k in order:
            times[k].append(time_call(lambda: step(*arms[k]), E2E_STEPS))
    tok = 32 * 64
    med = {k: float(np.median(v)) for k, v in times.items()}
    return dict(
        step_ms={k: v * 1e3 for k, v in med.items()},
        tokens_per_s={k: tok / v for k, v in med.items()},
        rmsnorm_speedup_pct=100 * (med["layernorm"] / med["rmsnorm"] - 1),
        step_ms_all={k: [t * 1e3 for t in v] for k, v in times.items()},
    )


def main() -> None:
    torch.set_num_threads(1)  # 1, not 2: on the shared 2-core CPU 2 threads ran 6-8x slower (measured)
    random.seed(0)
    torch.manual_seed(0)
    t0 = time.time()
    ops = op_level()
    e2e = end_to_end()
    res = dict(
        machine=machine(),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        note="2 CPU cores shared with other processes; numbers are medians of interleaved repetitions",
        reps=REPS,
        iters=ITERS,
        op_level=ops,
        end_to_end=e2e,
        seconds=round(time.time() - t0, 1),
    )
    (OUT / "bench.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in e2e.items() if k != "step_ms_all"}, indent=1))
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
