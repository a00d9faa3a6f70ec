"""Which implementation of each norm is fastest on this machine (minillm/norms/impl.py), and what it changes in a
training step: the table ``norm_impl=auto`` reads, measured.

    .venv/bin/python -m experiments.benchmarks.norm_impls.bench            # results.json / results.md here
    .venv/bin/python -m experiments.benchmarks.norm_impls.bench --quick --out /tmp/n   # a smoke run

Op level: forward + backward of one norm module on a (B, T, C) input, for every norm that has several
implementations x reference / torch / compiled (x triton on a GPU), fp32 and bf16, at the default model's shape
(32, 64, 128) and at a wider one (8, 512, 768); the implementations of one shape are timed in turn, ``--reps``
rounds, and the best round is kept (min over rounds of the mean of ``--iters`` calls). Every implementation is
first checked against the reference (outputs and gradients, the tolerances of tests/test_norms.py).

Step level: one training step (forward, backward, AdamW) of the default model (0.83M parameters, batch 32 x 64)
with RMSNorm and with LayerNorm, each norm under reference / torch / compiled, and the whole model compiled
(``model.compile=true``: the norms fused with the rest), interleaved the same way; the compile time of the
compiled rows is reported apart. One thread (the machine's other core may be busy: say the load).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.common.machine import machine
from minillm.model import ModelConfig, Transformer
from minillm.norms import NORMS, build_norm
from minillm.norms.base import Implemented

HERE = Path(__file__).resolve().parent
SHAPES = ((32, 64, 128), (8, 512, 768))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOL = {"fp32": dict(atol=1e-4, rtol=1e-4), "bf16": dict(atol=3e-2, rtol=3e-2)}


def impls_on(device: torch.device) -> tuple[str, ...]:
    return ("reference", "torch", "compiled") + (("triton",) if device.type == "cuda" else ())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _op(norm: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor) -> None:
    x.grad = None
    norm(x).backward(dy)


def _check(name: str, impl: str, x: torch.Tensor, dtype: str) -> bool:
    """The implementation's output and gradients equal the reference's within the tests' tolerances."""
    outs = []
    for which in ("reference", impl):
        norm = build_norm(name, x.shape[-1], impl=which).to(x.device)
        with torch.no_grad():
            for p in norm.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(p) * 0.3)
        xi = x.detach().clone().requires_grad_(True)
        y = norm(xi)
        outs.append([y, *torch.autograd.grad(y.float().sum(), [xi, *norm.parameters()])])
    return all(torch.allclose(a.float(), b.float(), **TOL[dtype]) for a, b in zip(*outs, strict=True))


def op_level(device: torch.device, iters: int, reps: int, shapes=SHAPES) -> list[dict]:
    rows = []
    names = [n for n, cls in NORMS.items() if issubclass(cls, Implemented) and not getattr(cls, "kernel", None)]
    for shape in shapes:
        for dtype in DTYPES:
            for name in names:
                x = torch.randn(*shape, device=device, dtype=DTYPES[dtype]) * 2 + 0.3
                dy = torch.randn_like(x)
                mods = {}
                for impl in impls_on(device):
                    norm = build_norm(name, shape[-1], impl=impl).to(device)
                    xi = x.clone().requires_grad_(True)
                    t0 = time.perf_counter()
                    _op(norm, xi, dy)  # the first call resolves (and compiles)
                    _sync(device)
                    first = time.perf_counter() - t0
                    for _ in range(3):
                        _op(norm, xi, dy)
                    mods[impl] = (norm, xi, first, _check(name, impl, x, dtype), norm.impl_used)
                times: dict[str, list[float]] = {impl: [] for impl in mods}
                for _ in range(reps):
                    for impl, (norm, xi, *_) in mods.items():
                        _sync(device)
                        t0 = time.perf_counter()
                        for _ in range(iters):
                            _op(norm, xi, dy)
                        _sync(device)
                        times[impl].append((time.perf_counter() - t0) / iters * 1e6)
                best = min(min(v) for v in times.values())
                for impl, (_, _, first, ok, ran) in mods.items():
                    rows.append({"shape": list(shape), "dtype": dtype, "norm": name, "impl": impl, "ran": ran,
                                 "matches_reference": ok, "us": round(min(times[impl]), 1),
                                 "vs_fastest": round(min(times[impl]) / best, 2), "first_call_s": round(first, 2)})
                print(f"{shape} {dtype} {name}: " + ", ".join(f"{r['impl']} {r['us']} us" for r in rows[-len(mods):]),
                      flush=True)
    return rows


def step_level(device: torch.device, iters: int, reps: int) -> list[dict]:
    x = torch.randint(0, 88, (32, 64), device=device)
    y = torch.randint(0, 88, (32, 64), device=device)
    cases = {}
    for norm in ("rmsnorm", "layernorm"):
        for impl in ("reference", "torch", "compiled", "model compiled"):
            torch.manual_seed(0)
            cfg = ModelConfig(vocab_size=88, norm=norm, norm_impl="reference" if impl == "model compiled" else impl)
            model = Transformer(cfg).to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            fwd = torch.compile(model) if impl == "model compiled" else model

            def step(fwd=fwd, opt=opt) -> None:
                loss = F.cross_entropy(fwd(x).float().flatten(0, 1), y.flatten())
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            t0 = time.perf_counter()
            for _ in range(3):
                step()
            _sync(device)
            cases[(norm, impl)] = (step, time.perf_counter() - t0)
    times: dict[tuple, list[float]] = {k: [] for k in cases}
    for _ in range(reps):
        for key, (step, _) in cases.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                step()
            _sync(device)
            times[key].append((time.perf_counter() - t0) / iters * 1e3)
    base = min(times[("rmsnorm", "reference")])
    rows = [{"norm": norm, "impl": impl, "ms_per_step": round(min(v), 2),
             "vs_rmsnorm_reference": round(min(v) / base, 3), "warmup_s": round(cases[(norm, impl)][1], 1)}
            for (norm, impl), v in times.items()]
    for r in rows:
        print(f"step {r['norm']} {r['impl']}: {r['ms_per_step']} ms (warm-up {r['warmup_s']} s)", flush=True)
    return rows


def markdown(result: dict) -> str:
    lines = [f"# Norm implementations, measured\n\nMachine: {result['machine']}; {result['threads']} thread(s); "
             f"load at start {result['load']}. Generated by `python -m experiments.benchmarks.norm_impls.bench`.\n",
             "## Forward + backward of one norm (microseconds; best round)\n",
             "| shape | dtype | norm | reference | torch | compiled | fastest | matches the reference |",
             "|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, dict] = {}
    for r in result["op"]:
        groups.setdefault((tuple(r["shape"]), r["dtype"], r["norm"]), {})[r["impl"]] = r
    for (shape, dtype, norm), by in groups.items():
        fastest = min(by.values(), key=lambda r: r["us"])
        cells = [f"{by[i]['us']}" + ("" if by[i]["ran"] == i else f" (ran {by[i]['ran']})") if i in by else "-"
                 for i in ("reference", "torch", "compiled")]
        ok = "yes" if all(r["matches_reference"] for r in by.values()) else "no"
        lines.append(f"| {'x'.join(map(str, shape))} | {dtype} | {norm} | {' | '.join(cells)} | "
                     f"{fastest['impl']} | {ok} |")
    lines += ["\n## One training step of the default model (milliseconds; best round)\n",
              "| norm | implementation | ms / step | vs RMSNorm reference | warm-up (incl. compile) s |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['norm']} | {r['impl']} | {r['ms_per_step']} | {r['vs_rmsnorm_reference']} | {r['warmup_s']} |"
              for r in result["step"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--quick", action="store_true", help="one small shape, few repetitions (a smoke run)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    iters, reps = (5, 2) if args.quick else (50, 5)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = {"machine": machine(), "threads": args.threads, "load": load,
              "op": op_level(device, iters, reps, SHAPES[:1] if args.quick else SHAPES),
              "step": step_level(device, 2 if args.quick else 10, reps)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(result))
    print(f"wrote {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
