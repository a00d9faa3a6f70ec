"""Fused RMSNorm benchmark (issue 4): kernel bandwidth against the baselines, and train-step time.

    python experiments/kernel_bench/bench.py          # CUDA GPU: writes results/<device>.{json,md,png}
    python experiments/kernel_bench/bench.py --smoke  # CPU, TRITON_INTERPRET=1, tiny shapes: a code check

Kernels: bf16 x and bf16 weight (an fp32 weight sends F.rms_norm down its slow unfused path), M rows x hidden,
forward (under no_grad) and forward+backward timed separately with triton.testing.do_bench (median, L2 flushed
between runs). Byte model, the same for every provider (es = 2 bytes for bf16, P = number of SMs):
    forward   read x (M*N*es) + w (N*es), write y (M*N*es) + rstd (M*4)
    backward  read x, dy (2*M*N*es) + w (N*es) + rstd (M*4), write dx (M*N*es) + fp32 dW partials (P*N*4)
    fwd+bwd   forward + backward
GB/s = bytes / median time; each figure is also given as a fraction of a large device-to-device copy
measured in the same run (the practical roofline).

Train step: a ~125M LLaMA-style model (dim 768, 12 layers, 12 heads, vocab 32000, T = 1024), bf16 autocast,
AdamW, norm = rmsnorm vs fused_rmsnorm, eager and torch.compile'd; median step time over timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repo root, when minillm is not installed

ROWS = (4096, 16384, 65536)
HIDDEN = (1024, 2048, 4096, 8192, 16384)
SMOKE_ROWS = (64,)
SMOKE_HIDDEN = (32, 100)
EPS = 1e-6
BASELINES = ("eager", "F.rms_norm", "torch.compile", "liger")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes on the CPU with TRITON_INTERPRET=1 (a code check: no real numbers)")
    p.add_argument("--mode", choices=("all", "kernels", "train"), default="all")
    p.add_argument("--rows", type=int, nargs="+", help=f"M values (default {ROWS})")
    p.add_argument("--hidden", type=int, nargs="+", help=f"hidden sizes (default {HIDDEN})")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    p.add_argument("--train-batch", type=int, default=8, help="sequences of 1024 tokens per train step")
    p.add_argument("--train-steps", type=int, default=20, help="timed train steps (after 5 warm-up steps)")
    p.add_argument("--out", type=Path, help="output folder (default: results/ here; temp folder if --smoke)")
    return p.parse_args()


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


def copy_gbps(device: str, smoke: bool) -> float:
    """Bandwidth of a large device-to-device copy (read + write), the roofline for a streaming kernel."""
    import torch

    n = 2**16 if smoke else 2**29  # 1 GiB of bf16 per buffer: far beyond L2
    src = torch.randn(n, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), smoke)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def fwd_bytes(m: int, n: int, es: int) -> int:
    return 2 * m * n * es + n * es + 4 * m


def bwd_bytes(m: int, n: int, es: int, programs: int) -> int:
    return 3 * m * n * es + n * es + 4 * m + 4 * programs * n


# ----------------------------------------------------------------------------------------------------------
# providers: each maps (weight, eps) to a function of x


def composite(x, w, eps: float):
    """Eager RMSNorm as most codebases write it: fp32 upcast, normalize, cast, multiply (LLaMA's order)."""
    import torch

    x32 = x.float()  # (M, N)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def make_providers(use_compile: bool) -> dict:
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
    except ImportError as e:
        print(f"liger-kernel not importable ({e}); skipping that baseline")
    return providers


def liger_status() -> str:
    """The Liger-Kernel version benchmarked, or why it is absent (recorded in the results)."""
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        return version("liger-kernel")
    except Exception as e:  # not installed, or broken on this machine
        return f"absent ({type(e).__name__})"


def bench_kernels(device: str, smoke: bool, rows, hidden, use_compile: bool, copy: float,
                  save=lambda rows: None) -> list[dict]:
    import torch

    from minillm.kernels import rmsnorm as K

    if use_compile:  # one static graph per shape and grad mode
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 4 * len(rows) * len(hidden) + 8)
    providers = make_providers(use_compile)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else K.INTERPRETER_SMS
    results = []
    for m in rows:
        for n in hidden:
            results += bench_shape(device, smoke, m, n, providers, sms, copy)
            save(results)  # after every shape: a run cut short keeps what it measured
    return results


def bench_shape(device: str, smoke: bool, m: int, n: int, providers: dict, sms: int,
                copy: float) -> list[dict]:
    """Every provider at one (M, hidden), bf16."""
    import torch

    torch.manual_seed(0)
    dtype, es = torch.bfloat16, 2
    x = torch.randn(m, n, device=device, dtype=dtype)  # (M, N)
    dy = torch.randn(m, n, device=device, dtype=dtype)  # (M, N)
    w = torch.nn.Parameter((1 + 0.1 * torch.randn(n, device=device)).to(dtype))  # (N,)
    b_fwd = fwd_bytes(m, n, es)
    b_all = b_fwd + bwd_bytes(m, n, es, sms)
    rows = []
    for name, make in providers.items():
        row = {"provider": name, "M": m, "hidden": n, "dtype": "bf16"}
        try:
            f = make(w, EPS)
            with torch.no_grad():
                if name == "fused":  # gate: every output within 2 bf16 ulps of the eager composite's
                    ref = composite(x, w, EPS).float()
                    err = (f(x).float() - ref).abs()
                    ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref).exponent - 8)  # bf16: 8 bits
                    ulps = 4 if smoke else 2  # the CPU interpreter truncates fp32 -> bf16 casts (README)
                    row["max_abs_diff_vs_eager"] = err.max().item()
                    row["matches_eager"] = bool((err <= ulps * ulp).all())
                ms = bench_ms(lambda f=f: f(x), smoke)
            row.update(fwd_ms=ms, fwd_gbps=b_fwd / (ms * 1e-3) / 1e9)
            xg = x.detach().clone().requires_grad_()
            dyp = dy.clone()  # Liger writes dx over dy by default: keep the shared dy intact
            ms = bench_ms(lambda f=f, xg=xg, dyp=dyp: f(xg).backward(dyp), smoke, grad_to_none=[xg, w])
            row.update(fwdbwd_ms=ms, fwdbwd_gbps=b_all / (ms * 1e-3) / 1e9)
            row["fwd_frac_copy"] = row["fwd_gbps"] / copy
            row["fwdbwd_frac_copy"] = row["fwdbwd_gbps"] / copy
        except Exception as e:  # an OOM or a broken baseline must not stop the sweep
            msg = str(e).splitlines()[0][:200] if str(e) else ""
            row["error"] = f"{type(e).__name__}: {msg}"
            if device == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        print(_fmt_row(row), flush=True)
    return rows


def _fmt_row(r: dict) -> str:
    head = f"{r['provider']:>14} M={r['M']:>6} N={r['hidden']:>6}"
    if "error" in r:
        return f"{head}  error: {r['error']}"
    return (f"{head}  fwd {r['fwd_ms']:.4f} ms {r['fwd_gbps']:8.1f} GB/s ({r['fwd_frac_copy']:.0%})"
            f"  fwd+bwd {r['fwdbwd_ms']:.4f} ms {r['fwdbwd_gbps']:8.1f} GB/s ({r['fwdbwd_frac_copy']:.0%})")


def check_targets(results: list[dict]) -> list[dict]:
    """The issue's targets, judged on this run's numbers: PASS / FAIL / n/a per shape."""
    by = {(r["provider"], r["M"], r["hidden"]): r for r in results if "error" not in r}
    checks = []
    for (prov, m, n), fused in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if prov != "fused":
            continue
        checks.append({"M": m, "hidden": n, "target": "fwd matches eager (<= 2 bf16 ulps)",
                       "value": f"{fused['max_abs_diff_vs_eager']:.3g}", "pass": fused["matches_eager"]})
        if m < 16384:
            continue
        if 2048 <= n <= 8192:
            checks.append({"M": m, "hidden": n, "target": "fwd >= 90% of copy",
                           "value": f"{fused['fwd_frac_copy']:.1%}", "pass": fused["fwd_frac_copy"] >= 0.9})
            for base in ("F.rms_norm", "torch.compile"):
                other = by.get((base, m, n))
                checks.append({"M": m, "hidden": n, "target": f"fwd >= {base}",
                               "value": "n/a" if other is None else
                               f"{fused['fwd_ms']:.4f} vs {other['fwd_ms']:.4f} ms",
                               "pass": None if other is None else fused["fwd_ms"] <= other["fwd_ms"]})
        for base in BASELINES:
            other = by.get((base, m, n))
            if other is not None:
                checks.append({"M": m, "hidden": n, "target": f"fwd+bwd >= {base}",
                               "value": f"{fused['fwdbwd_ms']:.4f} vs {other['fwdbwd_ms']:.4f} ms",
                               "pass": fused["fwdbwd_ms"] <= other["fwdbwd_ms"]})
    return checks


# ----------------------------------------------------------------------------------------------------------
# end-to-end train step


def bench_train(device: str, smoke: bool, use_compile: bool, batch: int, steps: int,
                save=lambda rows: None) -> list[dict]:
    import torch

    if smoke:
        kw = dict(vocab_size=256, dim=64, n_layers=2, n_heads=2, n_kv_heads=2, max_seq_len=32,
                  placement="pre")
        batch, steps, warmup = 2, 2, 1
    else:
        kw = dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=12, max_seq_len=1024,
                  placement="pre")
        warmup = 5
    out = []
    for norm in ("rmsnorm", "fused_rmsnorm"):
        for compiled in (False, True) if use_compile else (False,):
            try:
                row = train_one(device, kw, norm, compiled, batch, steps, warmup)
            except Exception as e:  # a compile failure must not lose the other rows
                row = {"norm": norm, "compiled": compiled, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            out.append(row)
            save(out)
            print(f"train {norm:>14} compiled={compiled!s:5}  " + (row.get("error") or
                  f"{row['step_ms']:8.2f} ms/step  {row['tokens_per_s']:10.0f} tok/s  loss {row['loss']:.3f}"),
                  flush=True)
            if compiled:
                torch._dynamo.reset()
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def train_one(device: str, kw: dict, norm: str, compiled: bool, batch: int, steps: int, warmup: int) -> dict:
    """Median train-step time of one configuration; everything it allocates is freed on return."""
    import torch
    import torch.nn.functional as F

    from minillm.model import ModelConfig, Transformer

    T, V = kw["max_seq_len"], kw["vocab_size"]
    torch.manual_seed(0)
    model = Transformer(ModelConfig(norm=norm, **kw)).to(device)
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
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
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
    return {"norm": norm, "compiled": compiled, "params_M": model.num_params() / 1e6, "batch": batch,
            "seq_len": T, "step_ms": ms, "tokens_per_s": batch * T / (ms * 1e-3), "loss": float(loss),
            "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}


# ----------------------------------------------------------------------------------------------------------
# reports


def write_markdown(path: Path, meta: dict, kernels: list[dict], checks: list[dict],
                   train: list[dict]) -> None:
    lines = [f"# Fused RMSNorm benchmark: {meta['device']}", "",
             f"torch {meta['torch']}, triton {meta['triton']}, liger-kernel {meta['liger']}, {meta['date']}"
             + (" (SMOKE RUN: CPU interpreter, numbers are meaningless)" if meta["smoke"] else ""), "",
             f"Copy roofline: {meta['copy_gbps']:.1f} GB/s (device-to-device copy, read + write).", "",
             "Byte model: fwd = read x + w, write y + rstd; bwd = read x, dy, w, rstd, write dx + fp32 dW "
             "partials (SMs x hidden); fwd+bwd = fwd + bwd. bf16 x and weight. Median of do_bench "
             "(of 3 wall-clock runs with --smoke).", ""]
    if kernels:
        lines += ["| M | hidden | provider | fwd ms | fwd GB/s | fwd % copy | fwd+bwd ms | fwd+bwd GB/s | "
                  "fwd+bwd % copy |", "|---|---|---|---|---|---|---|---|---|"]
        for r in kernels:
            if "error" in r:
                lines.append(f"| {r['M']} | {r['hidden']} | {r['provider']} | error: {r['error']} ||||||")
            else:
                lines.append(f"| {r['M']} | {r['hidden']} | {r['provider']} | {r['fwd_ms']:.4f} | "
                             f"{r['fwd_gbps']:.0f} | {r['fwd_frac_copy']:.0%} | {r['fwdbwd_ms']:.4f} | "
                             f"{r['fwdbwd_gbps']:.0f} | {r['fwdbwd_frac_copy']:.0%} |")
    if checks:
        n_pass = sum(c["pass"] is True for c in checks)
        lines += ["", f"## Targets: {n_pass} / {len(checks)} pass", "",
                  "| M | hidden | target | value | result |", "|---|---|---|---|---|"]
        for c in checks:
            res = "n/a" if c["pass"] is None else "PASS" if c["pass"] else "FAIL"
            lines.append(f"| {c['M']} | {c['hidden']} | {c['target']} | {c['value']} | {res} |")
    if train:
        lines += ["", "## Train step (bf16 autocast, AdamW)", "",
                  "| norm | compiled | params (M) | batch x T | ms/step | tokens/s | peak GiB |",
                  "|---|---|---|---|---|---|---|"]
        for r in train:
            if "error" in r:
                lines.append(f"| {r['norm']} | {r['compiled']} | error: {r['error']} |||||")
                continue
            mem = "" if r["peak_mem_GiB"] is None else f"{r['peak_mem_GiB']:.1f}"
            lines.append(f"| {r['norm']} | {r['compiled']} | {r['params_M']:.1f} | {r['batch']} x "
                         f"{r['seq_len']} | {r['step_ms']:.1f} | {r['tokens_per_s']:.0f} | {mem} |")
    path.write_text("\n".join(lines) + "\n")


def write_plot(path: Path, meta: dict, kernels: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    ok = [r for r in kernels if "error" not in r]
    rows = sorted({r["M"] for r in ok})
    if not rows:
        return
    fig, axes = plt.subplots(2, len(rows), figsize=(4.5 * len(rows), 7), squeeze=False, sharey=True)
    for j, m in enumerate(rows):
        for i, (key, title) in enumerate((("fwd_gbps", "forward"), ("fwdbwd_gbps", "forward + backward"))):
            ax = axes[i][j]
            for prov in dict.fromkeys(r["provider"] for r in ok):
                pts = sorted((r["hidden"], r[key]) for r in ok if r["M"] == m and r["provider"] == prov)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=prov)
            ax.axhline(meta["copy_gbps"], color="k", ls="--", lw=1, label="copy")
            ax.axhline(0.9 * meta["copy_gbps"], color="gray", ls=":", lw=1, label="90% copy")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{title}, M={m}")
            ax.set_xlabel("hidden")
            if j == 0:
                ax.set_ylabel("effective GB/s (byte model)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"RMSNorm bf16 on {meta['device']}" + (" (smoke)" if meta["smoke"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
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
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")
    out = args.out or (Path(tempfile.gettempdir()) / "minillm_kernel_bench_smoke" if args.smoke
                       else HERE / "results")
    out.mkdir(parents=True, exist_ok=True)
    rows = args.rows or (SMOKE_ROWS if args.smoke else ROWS)
    hidden = args.hidden or (SMOKE_HIDDEN if args.smoke else HIDDEN)
    use_compile = not args.no_compile

    copy = copy_gbps(device, args.smoke)
    meta = {"device": name, "smoke": args.smoke, "torch": torch.__version__, "triton": triton.__version__,
            "liger": liger_status(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "copy_gbps": copy, "eps": EPS,
            "byte_model": {"fwd": "2*M*N*es + N*es + 4*M",
                           "bwd": "3*M*N*es + N*es + 4*M + 4*SMs*N", "fwdbwd": "fwd + bwd"}}
    print(f"{name}: copy {copy:.1f} GB/s, liger-kernel {meta['liger']}", flush=True)
    path = out / f"{slug}.json"
    # --mode kernels and --mode train (two commands, each within a time limit) fill one report together
    report = json.loads(path.read_text()) if path.exists() and args.mode != "all" else {}
    report = {"kernels": [], "targets": [], "train_step": [], **report, "meta": meta}

    def save(section: str, rows: list[dict]) -> None:
        report[section] = rows
        if section == "kernels":
            report["targets"] = check_targets(rows)
        path.write_text(json.dumps(report, indent=1, default=str))
        write_markdown(path.with_suffix(".md"), meta, report["kernels"], report["targets"], report["train_step"])
        if report["kernels"]:
            write_plot(path.with_suffix(".png"), meta, report["kernels"])

    if args.mode != "train":
        bench_kernels(device, args.smoke, rows, hidden, use_compile, copy, lambda r: save("kernels", r))
    if args.mode != "kernels":
        bench_train(device, args.smoke, use_compile, args.train_batch, args.train_steps,
                    lambda r: save("train_step", r))
    written = ".json, .md" + (", .png" if report["kernels"] else "")
    print(f"wrote {path.with_suffix('')} {written}")


if __name__ == "__main__":
    main()
