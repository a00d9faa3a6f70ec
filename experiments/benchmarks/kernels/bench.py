"""Fused RMSNorm benchmark: kernel bandwidth against the baselines, backward tunables, train-step time.

    python -m experiments.benchmarks.kernels.bench --out DIR                 # CUDA GPU: kernels + train step
    python -m experiments.benchmarks.kernels.bench --mode kernels --out DIR  # one section; reports merge by key
    python -m experiments.benchmarks.kernels.bench --mode tune --out DIR     # time one-pass backward tunables
    python -m experiments.benchmarks.kernels.bench --smoke                   # CPU, TRITON_INTERPRET=1: a code check

Writes DIR/<device>.json, .md and .png after every shape and configuration (default DIR: a temp folder, never
the committed results); every row carries the record of this run (record.py: id, date, device, commit, kernel
code, command). Rows already in DIR/<device>.json are kept and replaced only by a re-measured key (report.KEYS);
--fresh starts over. A configuration that fails becomes a FAIL row and the rest goes on. Forward (no_grad),
backward alone and forward+backward are timed separately with triton.testing.do_bench (median, L2 flushed), and
once more as CUDA-graph replays (kernel time, no launch overhead; for minillm's kernels the backward kernel
alone too; n/a where capture fails); every provider of a shape --repeats times, interleaved. Byte model and
targets: report.py. Imports only torch, triton and minillm's model, kernels and loss (no datasets, hydra, omegaconf
or wandb).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import tempfile
from pathlib import Path

from experiments.benchmarks.kernels import report as R
from experiments.benchmarks.kernels.providers import (
    composite,
    error_line,
    liger_status,
    make_add_providers,
    make_providers,
)
from experiments.benchmarks.kernels.record import kernel_code, run_record
from experiments.benchmarks.kernels.timing import (
    add_bwd_bytes,
    add_fwd_bytes,
    bench_ms,
    bf16_order,
    bwd_bytes,
    copy_gbps,
    fwd_bytes,
    graph_ms,
    with_repeat,
)
from experiments.benchmarks.kernels.tune import bench_tune, use_tuned

ROWS = (16384, 65536, 4096)  # the shapes the targets judge (M >= 16K) first: a time limit loses the rest
HIDDEN = (1024, 2048, 4096, 8192, 16384)
SMOKE_ROWS, SMOKE_HIDDEN = (64,), (32, 100)
EPS = 1e-6


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU with TRITON_INTERPRET=1")
    p.add_argument("--mode", choices=("all", "kernels", "tune", "train"), default="all",
                   help="all = kernels + train")
    p.add_argument("--rows", type=int, nargs="+", help=f"M values (default {ROWS})")
    p.add_argument("--hidden", type=int, nargs="+", help=f"hidden sizes (default {HIDDEN})")
    p.add_argument("--providers", nargs="+", help="subset of fused eager F.rms_norm torch.compile liger, and of the "
                   "add + norm providers fused_add add+fused add+eager torch.compile liger_fused_add")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    p.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph timings")
    p.add_argument("--rep-ms", type=int, default=100, help="milliseconds of runs per timing (do_bench's rep)")
    p.add_argument("--graphs-only", action="store_true", help="time the CUDA-graph replays only (kernel time), not "
                   "the eager calls (launch-bound)")
    p.add_argument("--train-matrix", choices=("full", "loss"), default="full", help="the train step's configurations "
                   "(train_step.py): full = norms x compile x precision at --train-batch; loss = the chunked loss at "
                   "three batch sizes, fused_rmsnorm and the plain loss beside it")
    p.add_argument("--repeats", type=int, default=3, help="timings of every provider at a shape, interleaved "
                   "(repeat 1 of each provider, then repeat 2, ...); rows keep each, ratios give their spread")
    p.add_argument("--tune-rows", type=int, default=32768, help="M of the --mode tune timings")
    p.add_argument("--train-batch", type=int, default=8, help="sequences of 1024 tokens per train step")
    p.add_argument("--train-steps", type=int, default=20,
                   help="timed train steps (after 5 warm-up steps), in 4 windows of steps // 4 (at least 1)")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "minillm_kernel_bench",
                   help="output folder (default: %(default)s; commit a copy of what you mean to keep)")
    p.add_argument("--fresh", action="store_true", help="ignore rows already in the output folder")
    p.add_argument("--use-tuned", action="store_true", help="launch each backward variant's best config from the "
                   "tune rows of this kernel code already in the output folder (--mode tune first)")
    return p.parse_args(argv)


def bench_shape(device: str, smoke: bool, m: int, n: int, name: str, make, copy: float, graphs: bool,
                add: bool = False, rep_ms: int = 100, eager: bool = True) -> dict:
    """One provider at one (M, hidden), bf16: fwd, bwd alone, fwd+bwd (skipped without ``eager``), and the graph
    replays (fwd, fwd+bwd; for minillm's kernels also the backward kernel alone, called directly: its kernel time
    without the autograd engine). With add, the provider is an add + norm: f(x, residual) -> (y, h), with upstream
    gradients for both outputs."""
    import torch

    if device == "cuda":  # the previous provider's tensors and graph pools: 1 GiB each at M = 64K, hidden 8K
        gc.collect()
        torch.cuda.empty_cache()
    gen = torch.Generator(device).manual_seed(0)  # its own generator: a failed graph capture leaves the default one
    # registered to the dead capture, and every later draw from it would raise

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    x = randn(m, n).to(torch.bfloat16)  # (M, N)
    w = torch.nn.Parameter((1 + 0.1 * randn(n)).to(torch.bfloat16))  # (N,)
    inputs = [x, randn(m, n).to(x.dtype)] if add else [x]  # x (and the residual)
    grads_out = [randn(m, n).to(x.dtype) for _ in inputs]  # dy (and dh), drawn per provider: Liger writes dx over dy
    row = {"provider": name, "M": m, "hidden": n, "dtype": "bf16", "copy_gbps": copy}
    nbytes = {"fwd": (add_fwd_bytes if add else fwd_bytes)(m, n), "bwd": (add_bwd_bytes if add else bwd_bytes)(m, n)}
    nbytes["fwdbwd"] = nbytes["fwd"] + nbytes["bwd"]
    try:
        f = make(w, EPS)
    except Exception as e:
        return {**row, **{f"{p}_error": error_line(e) for p, _ in R.PHASES + R.GRAPH_PHASES}}
    leaves = [t.detach().clone().requires_grad_() for t in inputs]

    def outputs(args):
        out = f(*args)
        return list(out) if add else [out]

    def no_grad_fwd():
        with torch.no_grad():
            return outputs(inputs)

    def clear():
        for t in (*leaves, w):
            t.grad = None

    def fwdbwd():  # the gradients returned, not accumulated into .grad: no AccumulateGrad node, whose stream (the
        # one it was made on) a graph capture on another stream would have to wait for, failing the capture
        return torch.autograd.grad(outputs(leaves), [*leaves, w], grads_out)

    def run(phase: str, measure) -> None:
        try:
            ms = measure()
            row[f"{phase}_ms"] = ms
            gbps = nbytes[phase.removeprefix("graph_")] / (ms * 1e-3) / 1e9
            row[f"{phase}_gbps"], row[f"{phase}_frac"] = gbps, gbps / copy
        except Exception as e:  # an OOM, a broken baseline, a failed capture: a FAIL cell, the rest goes on
            row[f"{phase}_error"] = error_line(e)
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        finally:
            clear()

    if name in ("fused", "fused_add"):  # gate: every output within 2 bf16 steps of the eager composite's
        try:
            with torch.no_grad():  # no graph kept alive: it would hold w's AccumulateGrad node, made on the default
                # stream (a suspect in the one backward capture that fails on the H200, at 16K x 2K)
                ref = composite(sum(inputs), w, EPS)
            got = no_grad_fwd()[0]
            steps = (bf16_order(got) - bf16_order(ref)).abs()  # representable values apart, binade edges included
            row["max_abs_diff_vs_eager"] = (got.float() - ref.float()).abs().max().item()
            over = (steps > (4 if smoke else 2)) | got.isnan()  # the interpreter truncates; a NaN never matches
            row["matches_eager"] = not bool(over.any())
            if over.any():  # where, and how far: a few elements point to a race, many to the arithmetic
                worst = int(steps.argmax())
                row["beyond_2_steps"] = {"elements": int(over.sum()), "rows": int(over.any(-1).sum()),
                                        "worst_steps": int(steps.flatten()[worst]), "worst_at": list(divmod(worst, n)),
                                        "worst_ref": ref.flatten()[worst].item()}
        except Exception as e:
            row["fwd_error"] = error_line(e)
    if eager:
        run("fwd", lambda: bench_ms(no_grad_fwd, smoke, rep_ms=rep_ms))
        out = []  # the forward whose graph the backward-alone timing replays (retain_graph)
        try:
            out.append(outputs(leaves))
        except Exception as e:
            row["bwd_error"] = error_line(e)
        if out:
            run("bwd", lambda: bench_ms(lambda: torch.autograd.backward(out[0], grads_out, retain_graph=True), smoke,
                                        grad_to_none=[*leaves, w], rep_ms=rep_ms))
        out.clear()
        run("fwdbwd", lambda: bench_ms(fwdbwd, smoke, rep_ms=rep_ms))
    if graphs:
        run("graph_fwd", lambda: graph_ms(no_grad_fwd, smoke, rep_ms))
        run("graph_fwdbwd", lambda: graph_ms(fwdbwd, smoke, rep_ms))
        if name in ("fused", "fused_add"):
            run("graph_bwd", lambda: graph_ms(kernel_bwd(inputs, w, grads_out), smoke, rep_ms))
    return row


def kernel_bwd(inputs: list, w, grads_out: list):
    """minillm's backward kernel(s) alone, on the saved rstd of one forward (with the fused add's dh for two
    inputs), called directly: what its bandwidth is judged on."""
    import torch

    from minillm.kernels import rmsnorm as K

    with torch.no_grad():
        residual = inputs[1] if len(inputs) > 1 else None
        _y, rstd, h = K._fwd(inputs[0], w, EPS, 0.0, "llama", K._direct, residual=residual)
    x = inputs[0] if h is None else h
    dh = grads_out[1] if len(grads_out) > 1 else None
    return lambda: K._bwd(grads_out[0], x, w.detach(), rstd, 0.0, "llama", K._direct, dh=dh)


def _fmt(r: dict) -> str:
    cells = []
    for phase, _ in R.PHASES + R.GRAPH_PHASES:
        if r.get(f"{phase}_ms") is not None:
            cells.append(f"{phase} {r[f'{phase}_ms']:.4f} ms ({r[f'{phase}_frac']:.0%})")
        elif r.get(f"{phase}_error"):
            cells.append(f"{phase} FAIL {r[f'{phase}_error'][:60]}")
    return f"{r['provider']:>14} M={r['M']:>6} N={r['hidden']:>6}  " + "  ".join(cells)


def bench_kernels(args, device: str, copy: float, save) -> None:
    import torch

    rows = args.rows or (SMOKE_ROWS if args.smoke else ROWS)
    hidden = args.hidden or (SMOKE_HIDDEN if args.smoke else HIDDEN)
    if not args.no_compile:  # one static graph per shape and grad mode
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 4 * len(rows) * len(hidden) + 8)
    sections = (("kernels", make_providers(not args.no_compile, args.providers)),
                ("add_kernels", make_add_providers(not args.no_compile, args.providers)))
    graphs = device == "cuda" and not args.no_graphs
    phases = [p for p, _ in R.PHASES + R.GRAPH_PHASES]
    for m in rows:
        for n in hidden:
            for section, providers in sections:  # the norm, then the add + norm, at each shape
                measured: dict[str, dict] = {}
                for _ in range(args.repeats):  # interleaved: each repeat times every provider, back to back
                    for name, make in providers.items():
                        one = bench_shape(device, args.smoke, m, n, name, make, copy, graphs, section == "add_kernels",
                                          args.rep_ms, not args.graphs_only)
                        measured[name] = with_repeat(measured.get(name), one, phases)
                        print(_fmt(one), flush=True)
                    save(section, list(measured.values()))  # after every repeat: a run cut short keeps what it has


# ----------------------------------------------------------------------------------------------------------


def main(argv=None) -> Path:
    args = parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first imported
    import torch
    import triton

    from minillm.kernels import rmsnorm as K

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu" and not args.smoke:
        sys.exit("no CUDA GPU: run this on a GPU machine, or use --smoke to exercise the code on the CPU")
    K.require_fused()
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu-interpreter-smoke"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{re.sub(r'[^A-Za-z0-9._-]+', '-', name).strip('-')}.json"
    report = {} if args.fresh else R.load(path)
    copy = copy_gbps(device, args.smoke)
    words = sys.argv[1:] if argv is None else list(argv)
    run = run_record(name, " ".join(["python -m experiments.benchmarks.kernels.bench", *words]))
    if args.use_tuned:  # rows of tuned configs are another version of the kernels than the sources say
        run["kernel_code"] += "+tuned"
        run.update(use_tuned(report, kernel_code()))
    else:
        run.update(bwd_configs=[list(e) for e in K.BWD_CONFIGS], add_bwd_configs=[list(e) for e in K.ADD_BWD_CONFIGS])
    report["meta"] = {"device": name, "smoke": args.smoke, "torch": torch.__version__, "triton": triton.__version__,
                      "liger": liger_status(), "date": run["date"], "copy_gbps": copy, "run": run, "eps": EPS,
                      "bwd_configs": run["bwd_configs"], "add_bwd_configs": run["add_bwd_configs"],
                      "max_onepass_hidden": K.MAX_ONEPASS_HIDDEN}
    print(f"{name}: copy {copy:.1f} GB/s, liger-kernel {report['meta']['liger']}; writing {path}", flush=True)

    def save(section: str, rows: list[dict]) -> None:  # every row names this run
        report[section] = R.merge(report.get(section, []), [{**r, "run": run} for r in rows], section)
        R.write(path, report, plot_too=False)  # the plot once at the end (report.py draws it from the JSON too)

    R.write(path, report)
    if args.mode in ("all", "kernels"):
        bench_kernels(args, device, copy, save)
    if args.mode == "tune":
        bench_tune(args, device, copy, save, EPS)
    if args.mode in ("all", "train"):
        from experiments.benchmarks.kernels.train_step import bench_train

        bench_train(args, device, save)
    R.write(path, report)
    print("wrote " + ", ".join(str(path.with_suffix(x)) for x in (".json", ".md", ".png")
                               if path.with_suffix(x).exists()))
    failed = [r for section in R.KEYS for r in report.get(section, []) if any(k.endswith("error") for k in r)]
    if failed:  # the rows are written; the exit status says that some failed
        raise SystemExit(f"bench: {len(failed)} row(s) failed; see the error cells in {path.with_suffix('.md')}")
    return path


if __name__ == "__main__":
    main()
