"""The one-pass backward's tunables (``bench.py --mode tune``): both variants, the plain backward and the fused
residual add's, timed for every candidate config in one run, each variant's best marked; and ``--use-tuned``, which
makes a later mode of the same run folder launch each variant's best instead of the tables in
minillm/kernels/rmsnorm.py (the rows say which config ran)."""

from __future__ import annotations

from experiments.benchmarks.kernels.providers import error_line
from experiments.benchmarks.kernels.record import run_of
from experiments.benchmarks.kernels.timing import add_bwd_bytes, bench_ms, bwd_bytes

TUNE_HIDDEN = (1024, 2048, 4096, 8192, 16384)
MAX_ROW_ELEMENTS = 16384  # ROWS * BLOCK of one program: more does not fit an SM's registers with x and dy


def tune_candidates(n: int) -> list[tuple[int, int, int, int]]:
    """(ROWS, num_warps, programs per SM, STAGES): 1, 2 or 4 rows in flight per program, 8-32 elements of x and dy
    per thread, 8-64 warps per SM (fewer cannot hide the memory latency, more do not fit), no prefetch or a
    2-stage one."""
    block = 1 << (n - 1).bit_length()
    out = []
    for rows in (1, 2, 4):
        for warps in (4, 8, 16, 32):
            if rows * block > max(block, MAX_ROW_ELEMENTS) or not 8 <= rows * block / (32 * warps) <= 32:
                continue
            out += [(rows, warps, per_sm, stages) for per_sm in (1, 2, 4) if 8 <= per_sm * warps <= 64
                    for stages in (1, 2)]
    return out


def _block(n: int) -> int:
    return 1 << (n - 1).bit_length()


def bench_tune(args, device: str, copy: float, save, eps: float) -> None:
    """Backward alone (kernels + the partials' sum) for each candidate config, and for the wide-row two-kernel path,
    in both variants: without and with the fused residual add's gradient (dh); each compared with the two-kernel
    path's gradients."""
    import torch

    from minillm.kernels import rmsnorm as K

    m = 64 if args.smoke else args.tune_rows
    hidden = args.hidden or ((100,) if args.smoke else TUNE_HIDDEN)
    saved = K.BWD_CONFIGS, K.ADD_BWD_CONFIGS, K.MAX_ONEPASS_HIDDEN
    for n in hidden:
        torch.manual_seed(0)
        x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
        dy, w = torch.randn_like(x), (1 + 0.1 * torch.randn(n, device=device)).to(torch.bfloat16)
        dh = torch.randn_like(x)  # the fused residual add's backward: the gradient reaching h along the stream
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        onepass = n <= K.MAX_ONEPASS_HIDDEN
        current = (K.bwd_config(n), K.bwd_config(n, True)) if onepass else ("two-kernel", "two-kernel")
        cands = tune_candidates(n)[:2] if args.smoke else tune_candidates(n)
        cands = list(dict.fromkeys([c for c in current if c != "two-kernel"] + cands))
        reference = None  # the two-kernel path's gradients (timed first; a config is compared when it ran)
        for config in ["two-kernel", *cands]:
            row = {"config": str(config), "M": m, "hidden": n, "current": config == current[0],
                   "add_current": config == current[1], "copy_gbps": copy}
            try:
                if config == "two-kernel":
                    K.MAX_ONEPASS_HIDDEN = 0
                else:  # both variants on the candidate
                    K.BWD_CONFIGS = K.ADD_BWD_CONFIGS = ((_block(n), *config),)
                    K.MAX_ONEPASS_HIDDEN = n
                ms = bench_ms(lambda a=(dy, x, w, rstd): K._bwd(*a, 0.0, "llama", K._direct), args.smoke)
                gbps = bwd_bytes(m, n) / (ms * 1e-3) / 1e9
                row.update(bwd_ms=ms, bwd_gbps=gbps, bwd_frac=gbps / copy)
                ms = bench_ms(lambda a=(dy, x, w, rstd), r=dh: K._bwd(*a, 0.0, "llama", K._direct, dh=r), args.smoke)
                row.update(add_bwd_ms=ms, add_bwd_frac=add_bwd_bytes(m, n) / (ms * 1e-3) / 1e9 / copy)
                grads = [*K._bwd(dy, x, w, rstd, 0.0, "llama", K._direct),  # with and without the add's dh
                         *K._bwd(dy, x, w, rstd, 0.0, "llama", K._direct, dh=dh)]  # (dx, dw, dx, dw)
                if config == "two-kernel":
                    reference = grads
                elif reference is not None:  # the largest difference from the two-kernel path, relative
                    diff = [((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
                            for g, r in zip(grads, reference, strict=True)]
                    row.update(dx_vs_two_kernel=max(diff[0::2]), dw_vs_two_kernel=max(diff[1::2]))
            except Exception as e:
                row["bwd_error"] = error_line(e)
            finally:
                K.BWD_CONFIGS, K.ADD_BWD_CONFIGS, K.MAX_ONEPASS_HIDDEN = saved
            agree = (f", vs two-kernel dx {row['dx_vs_two_kernel']:.1e} dw {row['dw_vs_two_kernel']:.1e}"
                     if "dx_vs_two_kernel" in row else "")
            print(f"tune N={n} {row['config']:>16}: " + (f"{row['bwd_ms']:.4f} ms ({row['bwd_frac']:.0%}), with "
                  f"the add {row['add_bwd_ms']:.4f} ms{agree}" if "add_bwd_ms" in row else "")
                  + (f" FAIL {row['bwd_error']}" if "bwd_error" in row else ""), flush=True)
            save("tune", [row])


def best_configs(tune: list[dict], kernel_code: str) -> dict[str, dict[int, tuple]]:
    """{"plain": {hidden: config}, "add": {...}}: each variant's fastest one-pass config per hidden size among the
    tune rows of this kernel code (a config that agreed with the two-kernel path; the two-kernel path itself is
    not a table entry)."""
    best: dict[str, dict[int, tuple[float, tuple]]] = {"plain": {}, "add": {}}
    for r in tune:
        if run_of(r).get("kernel_code") != kernel_code or r["config"] == "two-kernel" or "dx_vs_two_kernel" not in r:
            continue
        config = tuple(int(v) for v in r["config"].strip("()").split(","))
        for variant, field in (("plain", "bwd_ms"), ("add", "add_bwd_ms")):
            ms = r.get(field)
            if ms is not None and (r["hidden"] not in best[variant] or ms < best[variant][r["hidden"]][0]):
                best[variant][r["hidden"]] = (ms, config)
    return {v: {n: c for n, (_, c) in found.items()} for v, found in best.items()}


def use_tuned(report: dict, kernel_code: str) -> dict[str, list]:
    """Launch each variant's tuned best (best_configs) instead of the table entry of its row block, for the rest
    of this process; returns the tables now in use (what the run's rows ran with)."""
    from minillm.kernels import rmsnorm as K

    best = best_configs(report.get("tune", []), kernel_code)
    for variant, name in (("plain", "BWD_CONFIGS"), ("add", "ADD_BWD_CONFIGS")):
        table = {entry[0]: tuple(entry[1:]) for entry in getattr(K, name)}
        for n, config in best[variant].items():
            if _block(n) in table:
                table[_block(n)] = config
        setattr(K, name, tuple((block, *config) for block, config in sorted(table.items())))
    return {"bwd_configs": [list(e) for e in K.BWD_CONFIGS], "add_bwd_configs": [list(e) for e in K.ADD_BWD_CONFIGS]}
