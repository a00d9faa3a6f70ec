"""Fused RMSNorm benchmark: kernel bandwidth against the baselines, backward tunables, train-step time.

    python -m experiments.benchmarks.kernels.bench --out DIR                 # CUDA GPU: kernels + train step
    python -m experiments.benchmarks.kernels.bench --mode kernels --out DIR  # one section; reports merge by key
    python -m experiments.benchmarks.kernels.bench --mode tune --out DIR     # time one-pass backward tunables
    python -m experiments.benchmarks.kernels.bench --smoke                   # CPU, TRITON_INTERPRET=1: a code check

Writes DIR/<device>.json, .md and .png after every shape and configuration (default DIR: a temp folder, never
the committed results). Rows already in DIR/<device>.json are kept and replaced only by a re-measured key
(provider, M, hidden), (config, M, hidden) or (norm, compiled); --fresh starts over. A configuration that fails
becomes a FAIL row and the rest goes on. Forward (no_grad), backward alone and forward+backward are timed
separately with triton.testing.do_bench (median, L2 flushed), and forward / forward+backward once more as a
CUDA-graph replay (no launch overhead; n/a where capture fails). Byte model and targets: report.py.
Imports only torch, triton and minillm's model and kernels (no datasets, hydra, omegaconf or wandb).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from experiments.benchmarks.kernels import report as R
from experiments.common.failure import failure

ROWS = (16384, 65536, 4096)  # the shapes the targets judge (M >= 16K) first: a time limit loses the rest
HIDDEN = (1024, 2048, 4096, 8192, 16384)
TUNE_HIDDEN = (1024, 2048, 4096, 8192, 16384)
SMOKE_ROWS, SMOKE_HIDDEN = (64,), (32, 100)
EPS = 1e-6


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU with TRITON_INTERPRET=1")
    p.add_argument("--mode", choices=("all", "kernels", "tune", "train"), default="all",
                   help="all = kernels + train")
    p.add_argument("--rows", type=int, nargs="+", help=f"M values (default {ROWS})")
    p.add_argument("--hidden", type=int, nargs="+", help=f"hidden sizes (default {HIDDEN})")
    p.add_argument("--providers", nargs="+", help="subset of fused eager F.rms_norm torch.compile liger")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    p.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph timings")
    p.add_argument("--tune-rows", type=int, default=32768, help="M of the --mode tune timings")
    p.add_argument("--train-batch", type=int, default=8, help="sequences of 1024 tokens per train step")
    p.add_argument("--train-steps", type=int, default=20, help="timed train steps (after 5 warm-up steps)")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "minillm_kernel_bench",
                   help="output folder (default: %(default)s; commit a copy of what you mean to keep)")
    p.add_argument("--fresh", action="store_true", help="ignore rows already in the output folder")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------------------
# timing


def bench_ms(fn, smoke: bool, grad_to_none=None) -> float:
    """Median milliseconds of fn(): triton's do_bench on a GPU, a few wall-clock runs in smoke mode."""
    if not smoke:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median"))
    fn()  # warm-up (compilation)
    times = []
    for _ in range(3):
        for t in grad_to_none or ():
            t.grad = None
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_ms(fn, smoke: bool) -> float:
    """Median milliseconds of fn captured once in a CUDA graph and replayed (warm-up on a side stream)."""
    import torch

    if smoke:
        raise RuntimeError("no CUDA graphs on the CPU")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        return bench_ms(graph.replay, smoke)
    finally:
        del graph


def copy_gbps(device: str, smoke: bool) -> float:
    """Bandwidth of a large device-to-device copy (read + write), the roofline of a streaming kernel."""
    import torch

    n = 2**16 if smoke else 2**29  # 1 GiB of bf16 per buffer: far beyond L2
    src = torch.randn(n, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), smoke)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def fwd_bytes(m: int, n: int, es: int = 2) -> int:
    return 2 * m * n * es + n * es + 4 * m


def bwd_bytes(m: int, n: int, es: int = 2) -> int:
    return 3 * m * n * es + 2 * n * es + 4 * m


def _error(e: Exception) -> str:
    return failure(e)["error"]


# ----------------------------------------------------------------------------------------------------------
# providers: each maps (weight, eps) to a function of x


def composite(x, w, eps: float):
    """Eager RMSNorm as most codebases write it: fp32 upcast, normalize, cast, multiply (LLaMA's order)."""
    import torch

    x32 = x.float()  # (M, N)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def make_providers(use_compile: bool, only=None) -> dict:
    import torch
    import torch.nn.functional as F

    from minillm.kernels.rmsnorm import fused_rms_norm

    providers = {
        "fused": lambda w, eps: lambda x: fused_rms_norm(x, w, eps, cast="llama"),
        "eager": lambda w, eps: lambda x: composite(x, w, eps),
        "F.rms_norm": lambda w, eps: lambda x: F.rms_norm(x, (x.shape[-1],), w, eps),
    }
    if use_compile:
        compiled = torch.compile(composite, dynamic=False)
        providers["torch.compile"] = lambda w, eps: lambda x: compiled(x, w, eps)
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm

        def liger(w, eps):
            try:
                mod = LigerRMSNorm(w.shape[0], eps=eps, casting_mode="llama")
            except TypeError:  # older releases have no casting_mode argument
                mod = LigerRMSNorm(w.shape[0], eps=eps)
            mod.weight = w  # share the benchmark's bf16 parameter
            return mod

        providers["liger"] = liger
        if os.environ.get("TRITON_INTERPRET") == "1" and (why := interpreter_refuses(liger)):
            import triton

            print(f"liger-kernel does not run under Triton {triton.__version__}'s interpreter ({why}); skipping that "
                  "baseline in this dry run (on a GPU it runs compiled)")
            del providers["liger"]
    except Exception as e:  # not installed, or broken on this machine
        print(f"liger-kernel not importable ({_error(e)}); skipping that baseline")
    return {k: v for k, v in providers.items() if not only or k in only}


def interpreter_refuses(make) -> str | None:
    """The error of a provider's forward and backward on a tiny CPU input, or None when it runs."""
    import torch

    w = torch.nn.Parameter(torch.ones(8))
    try:
        make(w, 1e-6)(torch.randn(2, 8, requires_grad=True)).sum().backward()
    except Exception as e:
        return _error(e)
    return None


def liger_status() -> str:
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        return version("liger-kernel")
    except Exception as e:
        return f"absent ({type(e).__name__})"


def bench_shape(device: str, smoke: bool, m: int, n: int, name: str, make, copy: float, graphs: bool) -> dict:
    """One provider at one (M, hidden), bf16: fwd, bwd alone, fwd+bwd, and the two graph replays."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)  # (M, N)
    dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)  # (M, N)
    w = torch.nn.Parameter((1 + 0.1 * torch.randn(n, device=device)).to(torch.bfloat16))  # (N,)
    row = {"provider": name, "M": m, "hidden": n, "dtype": "bf16", "copy_gbps": copy}
    nbytes = {"fwd": fwd_bytes(m, n), "bwd": bwd_bytes(m, n)}
    nbytes["fwdbwd"] = nbytes["fwd"] + nbytes["bwd"]
    try:
        f = make(w, EPS)
    except Exception as e:
        return {**row, **{f"{p}_error": _error(e) for p, _ in R.PHASES + R.GRAPH_PHASES}}
    xg = x.detach().clone().requires_grad_()
    dyp = dy.clone()  # Liger writes dx over dy by default: keep the shared dy intact

    def no_grad_fwd():
        with torch.no_grad():
            return f(x)

    def fwdbwd():  # fresh gradients each time (also inside a graph capture: no accumulation kernel)
        xg.grad = w.grad = None
        f(xg).backward(dyp)

    def run(phase: str, measure) -> None:
        try:
            ms = measure()
            row[f"{phase}_ms"] = ms
            gbps = nbytes[phase.removeprefix("graph_")] / (ms * 1e-3) / 1e9
            row[f"{phase}_gbps"], row[f"{phase}_frac"] = gbps, gbps / copy
        except Exception as e:  # an OOM, a broken baseline, a failed capture: a FAIL cell, the rest goes on
            row[f"{phase}_error"] = _error(e)
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        finally:
            xg.grad = w.grad = None

    if name == "fused":  # gate: every output within 2 bf16 ulps of the eager composite's
        try:
            ref = composite(x, w, EPS).float()
            err = (no_grad_fwd().float() - ref).abs()
            ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref).exponent - 8)  # bf16: 8 bits
            row["max_abs_diff_vs_eager"] = err.max().item()
            row["matches_eager"] = bool((err <= (4 if smoke else 2) * ulp).all())  # interpreter truncates
        except Exception as e:
            row["fwd_error"] = _error(e)
    run("fwd", lambda: bench_ms(no_grad_fwd, smoke))
    out = []  # the forward whose graph the backward-alone timing replays (retain_graph)
    try:
        out.append(f(xg))
    except Exception as e:
        row["bwd_error"] = _error(e)
    if out:
        run("bwd", lambda: bench_ms(lambda: out[0].backward(dyp, retain_graph=True), smoke, grad_to_none=[xg, w]))
    out.clear()
    run("fwdbwd", lambda: bench_ms(fwdbwd, smoke, grad_to_none=[xg, w]))
    if graphs:
        run("graph_fwd", lambda: graph_ms(no_grad_fwd, smoke))
        run("graph_fwdbwd", lambda: graph_ms(fwdbwd, smoke))
    return row


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
    providers = make_providers(not args.no_compile, args.providers)
    graphs = device == "cuda" and not args.no_graphs
    for m in rows:
        for n in hidden:
            for name, make in providers.items():
                row = bench_shape(device, args.smoke, m, n, name, make, copy, graphs)
                print(_fmt(row), flush=True)
                save("kernels", [row])  # after every configuration: a run cut short keeps what it measured


# ----------------------------------------------------------------------------------------------------------
# one-pass backward tunables


def tune_candidates(n: int) -> list[tuple[int, int, int, int]]:
    """(ROWS, num_warps, programs per SM, STAGES) with 8-16 elements per thread and <= 2048 threads per SM."""
    block = 1 << (n - 1).bit_length()
    out = []
    for rows in (1, 2, 4, 8):
        for warps in (4, 8, 16, 32):
            if rows * block > max(block, 2048) or not 8 <= rows * block / (32 * warps) <= 16:
                continue
            out += [(rows, warps, per_sm, stages) for per_sm in (1, 2, 4) if per_sm * warps <= 64
                    for stages in (1, 2)]
    return out


def bench_tune(args, device: str, copy: float, save) -> None:
    """Backward alone (kernels + the partials' sum) for each candidate config, and for the wide-row
    two-kernel path at hidden > MAX_ONEPASS_HIDDEN."""
    import torch

    from minillm.kernels import rmsnorm as K

    m = 64 if args.smoke else args.tune_rows
    hidden = args.hidden or ((SMOKE_HIDDEN[-1],) if args.smoke else TUNE_HIDDEN)
    saved = K.BWD_CONFIGS, K.MAX_ONEPASS_HIDDEN
    for n in hidden:
        torch.manual_seed(0)
        x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
        dy, w = torch.randn_like(x), (1 + 0.1 * torch.randn(n, device=device)).to(torch.bfloat16)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
        current = K.bwd_config(n) if n <= K.MAX_ONEPASS_HIDDEN else "two-kernel"
        cands = tune_candidates(n)[:2] if args.smoke else tune_candidates(n)
        cands = list(dict.fromkeys(([current] if current != "two-kernel" else []) + cands))
        for config in ["two-kernel", *cands]:
            row = {"config": str(config), "M": m, "hidden": n, "current": config == current, "copy_gbps": copy}
            try:
                if config == "two-kernel":
                    K.MAX_ONEPASS_HIDDEN = 0
                else:
                    K.BWD_CONFIGS, K.MAX_ONEPASS_HIDDEN = ((1 << (n - 1).bit_length(), *config),), n
                ms = bench_ms(lambda a=(dy, x, w, rstd): K._bwd(*a, 0.0, "llama", K._direct), args.smoke)
                gbps = bwd_bytes(m, n) / (ms * 1e-3) / 1e9
                row.update(bwd_ms=ms, bwd_gbps=gbps, bwd_frac=gbps / copy)
            except Exception as e:
                row["bwd_error"] = _error(e)
            finally:
                K.BWD_CONFIGS, K.MAX_ONEPASS_HIDDEN = saved
            print(f"tune N={n} {row['config']:>16}: " + (f"{row['bwd_ms']:.4f} ms ({row['bwd_frac']:.0%})"
                  if "bwd_ms" in row else f"FAIL {row['bwd_error']}"), flush=True)
            save("tune", [row])


# ----------------------------------------------------------------------------------------------------------
# end-to-end train step


def peak_flops(device: str) -> float | None:
    """bf16 dense peak of the GPU, from minillm's one table (None on the CPU)."""
    import torch

    from minillm.callbacks.perf import device_peak_flops

    return device_peak_flops(torch.device("cuda"), torch.bfloat16) if device == "cuda" else None


def bench_train(args, device: str, save) -> None:
    import torch

    if args.smoke:
        kw = dict(vocab_size=256, dim=64, n_layers=2, n_heads=2, n_kv_heads=2, max_seq_len=32, placement="pre")
        batch, steps, warmup = 2, 2, 1
    else:
        kw = dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=12, max_seq_len=1024,
                  placement="pre")
        batch, steps, warmup = args.train_batch, args.train_steps, 5
    peak = peak_flops(device)
    # most valuable first (a time limit loses the last): the compiled rows the targets judge, the fused kernel first
    compiles = (True, False) if not args.no_compile else (False,)
    order = [(norm, compiled, precision) for compiled in compiles for precision in ("bf16-mixed", "bf16-true")
             for norm in ("fused_rmsnorm", "rmsnorm")]
    for norm, compiled, precision in order:
        try:
            row = train_one(device, kw, norm, compiled, batch, steps, warmup, peak, precision)
        except Exception as e:  # a compile failure must not lose the other rows
            row = {"norm": norm, "compiled": compiled, "precision": precision, **failure(e)}
        save("train_step", [row])
        print(f"train {norm:>14} compiled={compiled!s:5} {precision:10} " + (row.get("error") or
              f"{row['step_ms']:8.2f} ms/step {row['tokens_per_s']:10.0f} tok/s MFU {row.get('mfu')}"),
              flush=True)
        torch._dynamo.reset()
        if device == "cuda":
            torch.cuda.empty_cache()


def train_one(device: str, kw: dict, norm: str, compiled: bool, batch: int, steps: int, warmup: int,
              peak: float | None, precision: str = "bf16-mixed") -> dict:
    """Median train-step time of one configuration; everything it allocates is freed on return. ``precision``:
    bf16-mixed (fp32 weights, bf16 autocast: the residual stream is fp32) or bf16-true (the model in bf16)."""
    import torch
    import torch.nn.functional as F

    from minillm.model import ModelConfig, Transformer

    T, V = kw["max_seq_len"], kw["vocab_size"]
    torch.manual_seed(0)
    cfg = ModelConfig(norm=norm, **kw)
    model = Transformer(cfg).to(device, dtype=torch.bfloat16 if precision == "bf16-true" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=device == "cuda")
    fwd = torch.compile(model) if compiled else model
    idx = torch.randint(V, (batch, T + 1), device=device)
    inp, tgt = idx[:, :-1], idx[:, 1:]
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup + steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            logits = fwd(inp)  # (B, T, V)
        loss = F.cross_entropy(logits.float().view(-1, V), tgt.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    tok_s = batch * T / (ms * 1e-3)
    try:
        from minillm.callbacks.perf import analytic_flops_per_token  # imports lightning

        flops = analytic_flops_per_token(cfg, T) * tok_s
        causal = analytic_flops_per_token(cfg, T, causal=True) * tok_s
    except Exception:
        flops = causal = None
    return {"norm": norm, "compiled": compiled, "precision": precision, "params_M": model.num_params() / 1e6,
            "batch": batch, "seq_len": T, "step_ms": ms, "tokens_per_s": tok_s, "loss": loss.item(),
            "flops_per_s": flops, "peak_flops": peak, "mfu": flops / peak if flops and peak else None,
            "mfu_causal": causal / peak if causal and peak else None,
            "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}


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
    report["meta"] = {"device": name, "smoke": args.smoke, "torch": torch.__version__, "triton": triton.__version__,
                      "liger": liger_status(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "copy_gbps": copy,
                      "eps": EPS, "bwd_configs": K.BWD_CONFIGS, "max_onepass_hidden": K.MAX_ONEPASS_HIDDEN}
    print(f"{name}: copy {copy:.1f} GB/s, liger-kernel {report['meta']['liger']}; writing {path}", flush=True)

    def save(section: str, rows: list[dict]) -> None:
        report[section] = R.merge(report.get(section, []), rows, section)
        R.write(path, report, plot_too=False)  # the plot once at the end (report.py draws it from the JSON too)

    R.write(path, report)
    if args.mode in ("all", "kernels"):
        bench_kernels(args, device, copy, save)
    if args.mode == "tune":
        bench_tune(args, device, copy, save)
    if args.mode in ("all", "train"):
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
