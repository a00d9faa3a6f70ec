"""Kernel benchmark reports: merge rows by key, judge the targets, write the markdown table and the plot.

Imports nothing beyond the standard library (matplotlib only for the plot, when it is installed), so the
merge and the report also run on a machine without torch:

    python -m experiments.benchmarks.kernels.report RESULTS.json      # rewrite RESULTS.md / .png from the JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = {"kernels": ("provider", "M", "hidden"), "add_kernels": ("provider", "M", "hidden"),
        "tune": ("config", "M", "hidden"), "train_step": ("norm", "compiled", "precision")}
BASELINES = ("eager", "F.rms_norm", "torch.compile", "liger")
PHASES = (("fwd", "fwd"), ("bwd", "bwd alone"), ("fwdbwd", "fwd+bwd"))
GRAPH_PHASES = (("graph_fwd", "fwd"), ("graph_fwdbwd", "fwd+bwd"))
BIG_M = 16384  # the targets hold from this many rows on
FWD_HIDDEN = (2048, 8192)  # forward targets: hidden in this range (inclusive)
MFU_TARGET = 0.50
ADD_SPEEDUP = 1.3  # the fused add + norm against the add, then the fused norm


def key(section: str, row: dict) -> tuple:
    return tuple(row.get(k) for k in KEYS[section])


def merge(old: list[dict], new: list[dict], section: str) -> list[dict]:
    """Rows of old and new, one per key, new winning (a re-measured shape replaces the old one only)."""
    rows = {key(section, r): r for r in old}
    rows.update({key(section, r): r for r in new})
    return list(rows.values())


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _ms(row: dict | None, phase: str, graphs: bool) -> tuple[float | None, str]:
    """(time, basis) of a phase: the CUDA-graph replay where there is one (no launch overhead), else eager."""
    if row is None:
        return None, ""
    if graphs and row.get(f"graph_{phase}_ms") is not None:
        return row[f"graph_{phase}_ms"], "graph"
    return row.get(f"{phase}_ms"), "eager"


def _vs(fused: dict, other: dict | None, phase: str, speedup: float = 1.0) -> tuple[str, str, bool | None]:
    """(value, margin, pass) of 'fused at least speedup times as fast as other' on the same basis for both."""
    if other is None:
        return "not measured", "", None
    graphs = fused.get(f"graph_{phase}_ms") is not None and other.get(f"graph_{phase}_ms") is not None
    (a, basis), (b, _) = _ms(fused, phase, graphs), _ms(other, phase, graphs)
    if a is None or b is None:
        return f"missing ({fused.get(f'{phase}_error') or other.get(f'{phase}_error') or 'error'})", "", None
    value = f"{a:.4f} vs {b:.4f} ms ({basis}" + (f", {b / a:.2f}x)" if speedup != 1.0 else ")")
    return value, f"{b / a - speedup:+.2f}x" if speedup != 1.0 else f"{b / a - 1:+.1%}", b >= speedup * a


def _frac(fused: dict, phase: str, target: float) -> tuple[str, str, bool | None]:
    frac = fused.get(f"{phase}_frac")
    if frac is None:
        return f"missing ({fused.get(f'{phase}_error', 'error')})", "", None
    value = f"{frac:.1%} of copy ({fused[f'{phase}_gbps']:.0f} GB/s)"
    return value, f"{(frac - target) * 100:+.1f} pts", frac >= target


def _gate_value(f: dict) -> str:
    """The forward gate's cell: the largest difference, and where the 2-step bound was passed."""
    value = f"max abs diff {f['max_abs_diff_vs_eager']:.3g}"
    if b := f.get("beyond_2_steps"):
        value += f"; {b['elements']} elements in {b['rows']} rows beyond 2 steps (worst {b['worst_steps']})"
    return value


def judge(report: dict) -> list[dict]:
    """The issue's targets on this report's numbers: one row per (target, shape), PASS / FAIL / n/a."""
    by = {key("kernels", r): r for r in report.get("kernels", [])}
    checks = []

    def add(target, m, n, value, margin, ok):
        checks.append(dict(target=target, M=m, hidden=n, value=value, margin=margin,
                           result="n/a" if ok is None else "PASS" if ok else "FAIL"))

    fused_rows = sorted((r for r in report.get("kernels", []) if r["provider"] == "fused"),
                        key=lambda r: (r["M"], r["hidden"]))
    for f in fused_rows:
        m, n = f["M"], f["hidden"]
        if "matches_eager" in f:
            add("fwd matches eager (<= 2 bf16 steps)", m, n, _gate_value(f), "",
                f["matches_eager"])
        if m < BIG_M:
            continue
        if FWD_HIDDEN[0] <= n <= FWD_HIDDEN[1]:
            add("fwd >= 90% of copy", m, n, *_frac(f, "fwd", 0.90))
            for base in ("F.rms_norm", "torch.compile", "liger"):
                add(f"fwd >= {base}", m, n, *_vs(f, by.get((base, m, n)), "fwd"))
            add("bwd alone >= 80% of copy", m, n, *_frac(f, "bwd", 0.80))
        for base in BASELINES:
            add(f"fwd+bwd >= {base}", m, n, *_vs(f, by.get((base, m, n)), "fwdbwd"))
    add_by = {key("add_kernels", r): r for r in report.get("add_kernels", [])}
    for f in sorted((r for r in add_by.values() if r["provider"] == "fused_add"), key=lambda r: (r["M"], r["hidden"])):
        m, n = f["M"], f["hidden"]
        if "matches_eager" in f:
            add("fused add + norm fwd matches eager (<= 2 bf16 steps)", m, n,
                _gate_value(f), "", f["matches_eager"])
        if m >= BIG_M:
            for phase, title in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
                add(f"fused add + norm {title} >= {ADD_SPEEDUP}x add, then fused norm", m, n,
                    *_vs(f, add_by.get(("add+fused", m, n)), phase, ADD_SPEEDUP))
    for r in report.get("train_step", []):
        if r.get("compiled") and r.get("precision", "bf16-mixed") in ("bf16-mixed", "bf16-true"):
            mfu = r.get("mfu_causal", r.get("mfu"))  # judged on the causal count (older rows: the full one)
            precision = r.get("precision", "bf16-mixed")
            target = f"125M train step {precision} + compile ({r['norm']}): MFU (causal count) >= 50%"
            if mfu is None:
                add(target, "-", "-", f"missing ({r.get('error', 'no peak FLOP/s known')})", "", None)
            else:
                add(target, "-", "-", f"MFU {mfu:.1%}", f"{(mfu - MFU_TARGET) * 100:+.1f} pts", mfu >= MFU_TARGET)
    return checks


def _cell(row: dict, phase: str) -> str:
    if row.get(f"{phase}_ms") is None:
        err = row.get(f"{phase}_error")
        return f"FAIL: {err}" if err else "n/a"
    out = f"{row[f'{phase}_ms']:.4f}"
    if row.get(f"{phase}_frac") is not None:
        out += f" ({row[f'{phase}_gbps']:.0f} GB/s, {row[f'{phase}_frac']:.0%})"
    return out


def markdown(report: dict) -> str:
    meta = report.get("meta", {})
    lines = [f"# Fused RMSNorm benchmark: {meta.get('device', '?')}", ""]
    if meta.get("smoke"):
        lines += ["**SMOKE RUN: CPU interpreter, tiny shapes; the numbers mean nothing.**", ""]
    lines += [f"torch {meta.get('torch')}, triton {meta.get('triton')}, liger-kernel {meta.get('liger')}, "
              f"{meta.get('date')}. Copy roofline: {meta.get('copy_gbps', 0):.1f} GB/s (device-to-device "
              "copy, 1 GiB on a GPU, read + write, measured in the same run as "
              "the rows; each row keeps its run's copy_gbps).", "",
              "Byte model (every provider, es = 2 bytes): fwd = read x + w, write y + rstd "
              "(2MN es + N es + 4M); bwd = read x, dy, w, rstd, write dx + dW (3MN es + 2N es + 4M); "
              "fwd+bwd = the sum. Times: median of triton.testing.do_bench (L2 flushed); `graph` columns replay "
              "the same work captured in a CUDA graph (no launch overhead). Cells: ms (GB/s, % of copy).", ""]
    kernels = sorted(report.get("kernels", []), key=lambda r: (r["M"], r["hidden"], r["provider"]))
    if kernels:
        lines += ["## Kernels (bf16)", "", "| M | hidden | provider | fwd | bwd alone | fwd+bwd | graph fwd | "
                  "graph fwd+bwd |", "|---|---|---|---|---|---|---|---|"]
        for r in kernels:
            cells = [_cell(r, p) for p, _ in PHASES + GRAPH_PHASES]
            lines.append(f"| {r['M']} | {r['hidden']} | {r['provider']} | " + " | ".join(cells) + " |")
    add_rows = sorted(report.get("add_kernels", []), key=lambda r: (r["M"], r["hidden"], r["provider"]))
    if add_rows:
        lines += ["", "## Residual add + RMSNorm (bf16)", "",
                  "y = RMSNorm(x + residual) and h = x + residual, with upstream gradients for both. GB/s from the "
                  "fused kernel's byte model for every provider: fwd = read x, residual, w, write y, h, rstd "
                  "(4MN es + N es + 4M); bwd = read dy, dh, h, w, rstd, write dx (= dresidual) and dW "
                  "(4MN es + 2N es + 4M). `add+fused` is the add as a torch op, then the fused norm.", "",
                  "| M | hidden | provider | fwd | bwd alone | fwd+bwd | graph fwd | graph fwd+bwd |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in add_rows:
            cells = [_cell(r, p) for p, _ in PHASES + GRAPH_PHASES]
            lines.append(f"| {r['M']} | {r['hidden']} | {r['provider']} | " + " | ".join(cells) + " |")
    checks = report.get("targets", [])
    if checks:
        n = {k: sum(c["result"] == k for c in checks) for k in ("PASS", "FAIL", "n/a")}
        lines += ["", f"## Targets: {n['PASS']} PASS, {n['FAIL']} FAIL, {n['n/a']} n/a", "",
                  "Margins: points above the bandwidth target, or how much slower the baseline is (+) than "
                  "fused. Speed targets compare CUDA-graph replays when both providers have one.", "",
                  "| target | M | hidden | value | margin | result |", "|---|---|---|---|---|---|"]
        lines += [f"| {c['target']} | {c['M']} | {c['hidden']} | {c['value']} | {c['margin']} | {c['result']} |"
                  for c in checks]
    lines += _tune_lines(report.get("tune", [])) + _train_lines(report.get("train_step", []))
    lines += _compile_lines(report.get("compile_check"))
    return "\n".join(lines) + "\n"


def _tune_lines(tune: list[dict]) -> list[str]:
    if not tune:
        return []
    lines = ["", "## One-pass backward tunables (`--tune`; config = ROWS, num_warps, programs/SM, STAGES)", "",
             "Largest difference from the two-kernel path (dx, dW; relative to the largest value, with and without "
             "the add's gradient): bf16 rounding is up to ~4e-3.", "",
             "| hidden | M | config | bwd ms | GB/s | % copy | with the add: ms, % copy | vs two-kernel: dx, dW | |",
             "|---|---|---|---|---|---|---|---|---|"]
    best = {}
    for r in tune:
        if r.get("bwd_ms") is not None and (r["hidden"] not in best or r["bwd_ms"] < best[r["hidden"]]["bwd_ms"]):
            best[r["hidden"]] = r
    for r in sorted(tune, key=lambda r: (r["hidden"], r.get("bwd_ms") or float("inf"))):
        mark = "best" if best.get(r["hidden"]) is r else ("current" if r.get("current") else "")
        if r.get("bwd_ms") is None:
            lines.append(f"| {r['hidden']} | {r['M']} | {r['config']} | FAIL: {r.get('bwd_error')} | | | | | |")
        else:
            add = f"{r['add_bwd_ms']:.4f}, {r['add_bwd_frac']:.0%}" if r.get("add_bwd_ms") is not None else "-"
            agree = (f"{r['dx_vs_two_kernel']:.1e}, {r['dw_vs_two_kernel']:.1e}" if "dx_vs_two_kernel" in r else
                     f"FAIL: {r['bwd_error']}" if r.get("bwd_error") else "-")
            lines.append(f"| {r['hidden']} | {r['M']} | {r['config']} | {r['bwd_ms']:.4f} | {r['bwd_gbps']:.0f} | "
                         f"{r['bwd_frac']:.0%} | {add} | {agree} | {mark} |")
    lines += ["", "Best per hidden: " + ", ".join(f"{h}: {b['config']}" for h, b in sorted(best.items()))]
    return lines


def _train_lines(train: list[dict]) -> list[str]:
    if not train:
        return []
    lines = ["", "## Train step (~125M LLaMA-style, AdamW)", "",
             "`bf16-mixed`: fp32 weights under bf16 autocast, so the residual stream and the norms' inputs stay fp32; "
             "`bf16-true`: the model in bf16, the setting where a bf16 norm kernel reads and writes bf16. MFU counts "
             "attention over all T keys (12 L C T per token, as PaLM and nanoGPT do), in brackets over the keys a "
             "causal mask keeps (6 L C (T + 1)); the target is judged on the causal count. ms/step: the median of "
             "windows of steps synchronized at their ends where a row has `window_ms`, else (older rows) the median "
             "of steps each synchronized.", "",
             "| norm | compiled | precision | params (M) | batch x T | ms/step | tokens/s | MFU | peak GiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in train:
        precision = r.get("precision", "bf16-mixed")
        if "error" in r:
            lines.append(f"| {r['norm']} | {r['compiled']} | {precision} | FAIL: {r['error']} | | | | | |")
            continue
        mfu = "n/a" if r.get("mfu") is None else f"{r['mfu']:.1%}" + (
            f" ({r['mfu_causal']:.1%} causal)" if r.get("mfu_causal") is not None else "")
        mem = "" if r.get("peak_mem_GiB") is None else f"{r['peak_mem_GiB']:.1f}"
        lines.append(f"| {r['norm']} | {r['compiled']} | {precision} | {r['params_M']:.1f} | "
                     f"{r['batch']} x {r['seq_len']} | {r['step_ms']:.1f} | {r['tokens_per_s']:.0f} | {mfu} | {mem} |")
    return lines


def _compile_lines(rows) -> list[str]:
    if not rows:
        return []
    if isinstance(rows, str):
        return ["", f"## Kernels as compiled here: {rows}"]
    lines = ["", f"## Kernels as compiled for sm_90 on this machine (Triton {rows[0].get('triton')})", "",
             "| kernel | hidden | warps | registers | spill bytes | global accesses (bits: count) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['hidden']} | {r['num_warps']} | {r['registers']} | {r['spill_bytes']} | "
              f"{r['accesses']} |" for r in rows]
    return lines


def plot(path: Path, report: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    ok = report.get("kernels", [])
    ms = sorted({r["M"] for r in ok})
    if not ms:
        return
    fig, axes = plt.subplots(3, len(ms), figsize=(4.5 * len(ms), 10), squeeze=False, sharey=True)
    copy = report.get("meta", {}).get("copy_gbps", 0)
    for j, m in enumerate(ms):
        for i, (phase, title) in enumerate(PHASES):
            ax = axes[i][j]
            for prov in dict.fromkeys(r["provider"] for r in ok):
                pts = sorted((r["hidden"], r[f"{phase}_gbps"]) for r in ok
                             if r["M"] == m and r["provider"] == prov and r.get(f"{phase}_gbps") is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=prov)
            ax.axhline(copy, color="k", ls="--", lw=1, label="copy")
            if phase != "fwdbwd":  # bandwidth targets: fwd 90%, bwd alone 80% of copy
                ax.axhline((0.9 if phase == "fwd" else 0.8) * copy, color="gray", ls=":", lw=1, label="target")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{title}, M={m}")
            ax.set_xlabel("hidden")
            if j == 0:
                ax.set_ylabel("GB/s (byte model)")
    axes[0][0].legend(fontsize=8)
    meta = report.get("meta", {})
    fig.suptitle(f"RMSNorm bf16 on {meta.get('device')}" + (" (smoke)" if meta.get("smoke") else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(path: Path, report: dict, plot_too: bool = True) -> None:
    """JSON, markdown and plot of a report (targets judged again on the merged rows)."""
    report["targets"] = judge(report)
    path.write_text(json.dumps(report, indent=1, default=str))
    path.with_suffix(".md").write_text(markdown(report))
    if plot_too and report.get("kernels"):
        plot(path.with_suffix(".png"), report)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        write(Path(arg), load(Path(arg)))
        print(f"rewrote {Path(arg).with_suffix('.md')}")
