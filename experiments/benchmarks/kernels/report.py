"""Kernel benchmark reports: merge rows by key, judge the targets, write the markdown table and the plot.

Imports nothing beyond the standard library (matplotlib only for the plot, when it is installed), so the
merge and the report also run on a machine without torch:

    python -m experiments.benchmarks.kernels.report RESULTS.json      # rewrite RESULTS.md / .png from the JSON

Every row names the run that measured it (record.py): the tables give each row's run, the runs table says what each
run was, and a speed ratio is judged only between two rows of one run. A row timed over several repeats
(``<phase>_repeats``, interleaved with the other providers of its shape) gives its ratios as the median and the
range of the per-repeat ratios.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from experiments.benchmarks.kernels import record
from experiments.benchmarks.kernels.record import UNRECORDED, label, run_of

KEYS = {"kernels": ("provider", "M", "hidden"), "add_kernels": ("provider", "M", "hidden"),
        "tune": ("config", "M", "hidden"), "train_step": ("norm", "compiled", "precision", "batch", "loss_impl")}
BASELINES = ("eager", "F.rms_norm", "torch.compile", "liger")
PHASES = (("fwd", "fwd"), ("bwd", "bwd alone"), ("fwdbwd", "fwd+bwd"))
GRAPH_PHASES = (("graph_fwd", "fwd"), ("graph_bwd", "bwd alone"), ("graph_fwdbwd", "fwd+bwd"))
BIG_M = 16384  # the targets hold from this many rows on
FWD_HIDDEN = (2048, 8192)  # forward targets: hidden in this range (inclusive)
MFU_TARGET = 0.45  # causal count (6 L C (T + 1) attention FLOPs per token)
ADD_SPEEDUP = 1.3  # the fused add + norm against the add, then the fused norm (fwd+bwd; forward: ADD_FWD_BOUND)
ADD_FWD_BOUND = 1.25  # the forward's byte bound: the add then the norm move 5 MN elements, the fused kernel 4 MN
ADD_FWD_SHARE = 0.95  # forward target: this share of the byte bound


def key(section: str, row: dict) -> tuple:
    return tuple(row.get(k) for k in KEYS[section])


def merge(old: list[dict], new: list[dict], section: str) -> list[dict]:
    """Rows of old and new, one per key, new winning (a re-measured shape replaces the old one only)."""
    rows = {key(section, r): r for r in old}
    rows.update({key(section, r): r for r in new})
    return list(rows.values())


def runs(report: dict) -> dict[str, dict]:
    """The runs of every section's rows, labelled (record.runs)."""
    return record.runs([r for section in KEYS for r in report.get(section, [])], report.get("meta", {}).get("runs", []))


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _timing(row: dict, phase: str, graphs: bool) -> tuple[list[float], str]:
    """(times per repeat, basis) of a phase: the CUDA-graph replays where the caller says both sides have them (no
    launch overhead), else eager; one time for a row timed once."""
    name = f"graph_{phase}" if graphs else phase
    times = row.get(f"{name}_repeats") or ([row[f"{name}_ms"]] if row.get(f"{name}_ms") is not None else [])
    return times, "graph" if graphs else "eager"


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """"[min, max], n repeats" of per-repeat values, or "1 repeat" (its spread unmeasured)."""
    if len(values) < 2:
        return "1 repeat"
    return f"[{fmt.format(min(values))}, {fmt.format(max(values))}], {len(values)} repeats"


def ratios(fused: dict, other: dict, phase: str) -> tuple[list[float], str]:
    """other's time over fused's, per repeat where both rows were timed over the same repeats (interleaved: repeat i
    of each provider ran back to back), else the ratio of the medians alone; and the basis (graph or eager)."""
    graphs = fused.get(f"graph_{phase}_ms") is not None and other.get(f"graph_{phase}_ms") is not None
    (a, basis), (b, _) = _timing(fused, phase, graphs), _timing(other, phase, graphs)
    if not a or not b:
        return [], basis
    if len(a) == len(b):
        return [y / x for x, y in zip(a, b, strict=True)], basis
    return [statistics.median(b) / statistics.median(a)], basis


def _vs(fused: dict, other: dict | None, phase: str, report_runs: dict, speedup: float = 1.0
        ) -> tuple[str, str, bool | None]:
    """(value, margin, pass) of 'fused at least speedup times as fast as other', on the same basis for both and only
    within one run; judged on the median of the per-repeat ratios."""
    if other is None:
        return "not measured", "", None
    if run_of(fused)["id"] != run_of(other)["id"]:
        return f"not comparable: rows of runs {label(report_runs, fused)} and {label(report_runs, other)}", "", None
    found, basis = ratios(fused, other, phase)
    if not found:
        return f"missing ({fused.get(f'{phase}_error') or other.get(f'{phase}_error') or 'error'})", "", None
    mid = statistics.median(found)
    a, b = _timing(fused, phase, basis == "graph")[0], _timing(other, phase, basis == "graph")[0]
    value = (f"{statistics.median(a):.4f} vs {statistics.median(b):.4f} ms ({basis}, {mid:.3f}x; "
             f"{spread(found, '{:.3f}x')})")
    margin = f"{mid - speedup:+.2f}x" if speedup != 1.0 else f"{mid - 1:+.1%}"
    return value, margin, mid >= speedup


def _frac(fused: dict, phase: str, target: float) -> tuple[str, str, bool | None]:
    """A bandwidth target, on the CUDA-graph replay (kernel time) where the row has one, else the eager timing."""
    basis = "graph" if fused.get(f"graph_{phase}_frac") is not None else "eager"
    key = f"graph_{phase}" if basis == "graph" else phase
    frac = fused.get(f"{key}_frac")
    if frac is None:
        return f"missing ({fused.get(f'{phase}_error', 'error')})", "", None
    copy = fused.get("copy_gbps") or fused[f"{key}_gbps"] / frac
    per = [fused[f"{key}_gbps"] * fused[f"{key}_ms"] / ms / copy for ms in fused.get(f"{key}_repeats") or []]
    value = f"{frac:.1%} of copy ({fused[f'{key}_gbps']:.0f} GB/s, {basis}; {spread(per or [frac], '{:.1%}')})"
    return value, f"{(frac - target) * 100:+.1f} pts", frac >= target


def _gate_value(f: dict) -> str:
    """The forward gate's cell: the largest difference, and where the 2-step bound was passed."""
    value = f"max abs diff {f['max_abs_diff_vs_eager']:.3g}"
    if b := f.get("beyond_2_steps"):
        value += f"; {b['elements']} elements in {b['rows']} rows beyond 2 steps (worst {b['worst_steps']})"
    return value


def train_name(r: dict) -> str:
    """A train-step row in words: norm, precision, batch, loss (older rows: batch 8, the plain loss)."""
    loss = r.get("loss_impl") or "plain"
    return f"{r['norm']}, {r.get('precision', 'bf16-mixed')}, batch {r.get('batch', '?')}, {loss} loss"


def judge(report: dict) -> list[dict]:
    """The targets on this report's numbers: one row per (target, shape), PASS / FAIL / n/a, with the runs whose rows
    it reads (a ratio between rows of two runs is n/a: not comparable)."""
    by = {key("kernels", r): r for r in report.get("kernels", [])}
    report_runs = runs(report)
    checks = []

    def add(target, m, n, rows, value, margin, ok):
        used = ", ".join(dict.fromkeys(label(report_runs, r) for r in rows if r is not None))
        checks.append(dict(target=target, M=m, hidden=n, value=value, margin=margin, runs=used,
                           result="n/a" if ok is None else "PASS" if ok else "FAIL"))

    fused_rows = sorted((r for r in report.get("kernels", []) if r["provider"] == "fused"),
                        key=lambda r: (r["M"], r["hidden"]))
    for f in fused_rows:
        m, n = f["M"], f["hidden"]
        if "matches_eager" in f:
            add("fwd matches eager (<= 2 bf16 steps)", m, n, [f], _gate_value(f), "", f["matches_eager"])
        if m < BIG_M:
            continue
        if FWD_HIDDEN[0] <= n <= FWD_HIDDEN[1]:
            add("fwd >= 90% of copy", m, n, [f], *_frac(f, "fwd", 0.90))
            for base in ("F.rms_norm", "torch.compile", "liger"):
                other = by.get((base, m, n))
                add(f"fwd >= {base}", m, n, [f, other], *_vs(f, other, "fwd", report_runs))
            add("bwd alone >= 80% of copy", m, n, [f], *_frac(f, "bwd", 0.80))
        for base in BASELINES:
            other = by.get((base, m, n))
            add(f"fwd+bwd >= {base}", m, n, [f, other], *_vs(f, other, "fwdbwd", report_runs))
    add_by = {key("add_kernels", r): r for r in report.get("add_kernels", [])}
    for f in sorted((r for r in add_by.values() if r["provider"] == "fused_add"), key=lambda r: (r["M"], r["hidden"])):
        m, n = f["M"], f["hidden"]
        if "matches_eager" in f:
            add("fused add + norm fwd matches eager (<= 2 bf16 steps)", m, n, [f], _gate_value(f), "",
                f["matches_eager"])
        if m >= BIG_M:
            other = add_by.get(("add+fused", m, n))
            fwd_target = round(ADD_FWD_SHARE * ADD_FWD_BOUND, 4)
            add(f"fused add + norm fwd >= {fwd_target}x add, then fused norm ({ADD_FWD_SHARE:.0%} of the "
                f"{ADD_FWD_BOUND}x byte bound)", m, n, [f, other], *_vs(f, other, "fwd", report_runs, fwd_target))
            add(f"fused add + norm fwd+bwd >= {ADD_SPEEDUP}x add, then fused norm", m, n, [f, other],
                *_vs(f, other, "fwdbwd", report_runs, ADD_SPEEDUP))
    for r in report.get("train_step", []):
        if r.get("compiled") and r.get("precision", "bf16-mixed") in ("bf16-mixed", "bf16-true"):
            mfu = r.get("mfu_causal", r.get("mfu"))  # judged on the causal count (older rows: the full one)
            target = f"125M train step + compile ({train_name(r)}): MFU (causal count) >= {MFU_TARGET:.0%}"
            if mfu is None:
                add(target, "-", "-", [r], f"missing ({r.get('error', 'no peak FLOP/s known')})", "", None)
            else:
                add(target, "-", "-", [r], f"MFU {mfu:.1%}", f"{(mfu - MFU_TARGET) * 100:+.1f} pts",
                    mfu >= MFU_TARGET)
    return checks


def _cell(row: dict, phase: str) -> str:
    if row.get(f"{phase}_ms") is None:
        err = row.get(f"{phase}_error")
        return f"FAIL: {err}" if err else "n/a"
    out = f"{row[f'{phase}_ms']:.4f}"
    if row.get(f"{phase}_frac") is not None:
        out += f" ({row[f'{phase}_gbps']:.0f} GB/s, {row[f'{phase}_frac']:.0%})"
    return out


def _runs_lines(report_runs: dict[str, dict]) -> list[str]:
    lines = ["## Runs", "", "Every row names the run (the process) that measured it. A speed ratio is judged only "
             "between two rows of one run; rows of other runs are shown, not compared. `kernel code`: a hash of "
             "minillm's kernel sources (record.py), so rows of two versions of the kernels are told apart.", "",
             "| run | id | date | device | commit | kernel code | command | rows |", "|" + "---|" * 8]
    for r in report_runs.values():
        cells = [r.get(k) or UNRECORDED for k in ("id", "date", "device", "commit", "kernel_code", "command")]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + f" | {r['rows']} |")
    return lines + [""]


def _phase_table(title: str, intro: str, rows: list[dict], report_runs: dict) -> list[str]:
    lines = ["", f"## {title}", "", *([intro, ""] if intro else []),
             "| M | hidden | provider | run | fwd | bwd alone | fwd+bwd | graph fwd | graph bwd alone "
             "| graph fwd+bwd |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["M"], r["hidden"], r["provider"])):
        cells = [_cell(r, p) for p, _ in PHASES + GRAPH_PHASES]
        lines.append(f"| {r['M']} | {r['hidden']} | {r['provider']} | {label(report_runs, r)} | " + " | ".join(cells)
                     + " |")
    return lines


def markdown(report: dict) -> str:
    meta = report.get("meta", {})
    report_runs = runs(report)
    lines = [f"# Fused RMSNorm benchmark: {meta.get('device', '?')}", ""]
    if meta.get("smoke"):
        lines += ["**SMOKE RUN: CPU interpreter, tiny shapes; the numbers mean nothing.**", ""]
    lines += [f"torch {meta.get('torch')}, triton {meta.get('triton')}, liger-kernel {meta.get('liger')}, "
              f"{meta.get('date')} (the last run). Copy roofline: {meta.get('copy_gbps', 0):.1f} GB/s "
              "(device-to-device copy, 1 GiB on a GPU, read + write, measured by each run at its start; each row "
              "keeps its run's copy_gbps).", "",
              "Byte model (every provider, es = 2 bytes): fwd = read x + w, write y + rstd "
              "(2MN es + N es + 4M); bwd = read x, dy, w, rstd, write dx + dW (3MN es + 2N es + 4M); "
              "fwd+bwd = the sum. Times: median of triton.testing.do_bench (L2 flushed), and over the repeats where "
              "a row has several; `graph` columns replay the same work captured in a CUDA graph (no launch "
              "overhead). Cells: ms (GB/s, % of copy).", ""]
    if report_runs:
        lines += _runs_lines(report_runs)
    if report.get("kernels"):
        lines += _phase_table("Kernels (bf16)", "", report["kernels"], report_runs)
    if report.get("add_kernels"):
        lines += _phase_table(
            "Residual add + RMSNorm (bf16)",
            "y = RMSNorm(x + residual) and h = x + residual, with upstream gradients for both. GB/s from the "
            "fused kernel's byte model for every provider: fwd = read x, residual, w, write y, h, rstd "
            "(4MN es + N es + 4M); bwd = read dy, dh, h, w, rstd, write dx (= dresidual) and dW "
            "(4MN es + 2N es + 4M). `add+fused` is the add as a torch op, then the fused norm. The byte bound of "
            "fusing: the add then the norm move 5 MN elements forward (4 MN fused: at most 1.25x) and 11 MN "
            "forward+backward (8 MN fused: at most 1.375x).", report["add_kernels"], report_runs)
    checks = report.get("targets", [])
    if checks:
        n = {k: sum(c["result"] == k for c in checks) for k in ("PASS", "FAIL", "n/a")}
        lines += ["", f"## Targets: {n['PASS']} PASS, {n['FAIL']} FAIL, {n['n/a']} n/a", "",
                  "Margins: points above the bandwidth target, or how much slower the baseline is (+) than "
                  "fused, on the median of the per-repeat ratios ([min, max] over the repeats). Speed targets "
                  "compare CUDA-graph replays when both providers have one, and only rows of one run.", "",
                  "| target | M | hidden | runs | value | margin | result |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {c['target']} | {c['M']} | {c['hidden']} | {c.get('runs', '')} | {c['value']} | {c['margin']} | "
                  f"{c['result']} |" for c in checks]
    lines += _tune_lines(report.get("tune", []), report_runs)
    lines += _train_lines(report.get("train_step", []), report_runs)
    lines += _compile_lines(report.get("compile_check"))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines) + "\n")  # no runs of blank lines


VARIANTS = (("bwd", "plain"), ("add_bwd", "add"))  # the tune times both backward variants of every config


def _tune_lines(tune: list[dict], report_runs: dict) -> list[str]:
    if not tune:
        return []
    lines = ["", "## One-pass backward tunables (`--tune`; config = ROWS, num_warps, programs/SM, STAGES)", "",
             "Both variants of every config in one run: the plain backward and the fused add's (with the gradient "
             "reaching h), each with its own best and its own current config. Largest difference from the "
             "two-kernel path (dx, dW; relative to the largest value, with and without the add's gradient): bf16 "
             "rounding is up to ~4e-3.", "",
             "| hidden | M | config | run | bwd ms | GB/s | % copy | with the add: ms, % copy | vs two-kernel: dx, dW "
             "| |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    best = {}
    for prefix, variant in VARIANTS:
        for r in tune:
            ms = r.get(f"{prefix}_ms")
            held = best.get((variant, r["hidden"]))
            if ms is not None and (held is None or ms < held[f"{prefix}_ms"]):
                best[variant, r["hidden"]] = r
    for r in sorted(tune, key=lambda r: (r["hidden"], r.get("bwd_ms") or float("inf"))):
        marks = [f"best ({v})" for v in ("plain", "add") if best.get((v, r["hidden"])) is r]
        marks += [f"current ({v})" for v, flag in (("plain", "current"), ("add", "add_current")) if r.get(flag)]
        mark = ", ".join(marks)
        run = label(report_runs, r)
        if r.get("bwd_ms") is None:
            lines.append(f"| {r['hidden']} | {r['M']} | {r['config']} | {run} | FAIL: {r.get('bwd_error')} | | | | | "
                         f"{mark} |")
        else:
            add = f"{r['add_bwd_ms']:.4f}, {r['add_bwd_frac']:.0%}" if r.get("add_bwd_ms") is not None else "-"
            agree = (f"{r['dx_vs_two_kernel']:.1e}, {r['dw_vs_two_kernel']:.1e}" if "dx_vs_two_kernel" in r else
                     f"FAIL: {r['bwd_error']}" if r.get("bwd_error") else "-")
            lines.append(f"| {r['hidden']} | {r['M']} | {r['config']} | {run} | {r['bwd_ms']:.4f} | "
                         f"{r['bwd_gbps']:.0f} | {r['bwd_frac']:.0%} | {add} | {agree} | {mark} |")
    for _, variant in VARIANTS:
        found = sorted((h, b["config"]) for (v, h), b in best.items() if v == variant)
        if found:
            lines += ["", f"Best per hidden ({variant}): " + ", ".join(f"{h}: {c}" for h, c in found)]
    return lines


def train_ratio(row: dict, base: dict) -> list[float]:
    """row's tokens/s over base's, per window where both rows were timed in the same interleaved windows, else the
    ratio of the medians alone."""
    a, b = row.get("window_ms") or [], base.get("window_ms") or []
    if a and len(a) == len(b) and row.get("interleaved") and base.get("interleaved"):
        return [y / x for x, y in zip(a, b, strict=True)]
    return [base["step_ms"] / row["step_ms"]]


def _train_lines(train: list[dict], report_runs: dict) -> list[str]:
    if not train:
        return []
    lines = ["", "## Train step (~125M LLaMA-style, AdamW)", "",
             "`bf16-mixed`: fp32 weights under bf16 autocast, so the residual stream and the norms' inputs stay fp32; "
             "`bf16-true`: the model in bf16, the setting where a bf16 norm kernel reads and writes bf16. `loss`: "
             "`plain` materializes the fp32 logits of the whole batch, `chunked` (minillm.training.loss) "
             "never does. MFU counts "
             "attention over all T keys (12 L C T per token, as PaLM and nanoGPT do), in brackets over the keys a "
             "causal mask keeps (6 L C (T + 1)); the target is judged on the causal count. ms/step: the median of "
             "windows of steps synchronized at their ends where a row has `window_ms` (its [min, max] over the "
             "windows), else (older rows) the median of steps each synchronized. `vs rmsnorm`: tokens/s over the "
             "`rmsnorm` row of the same run, compile, precision, batch and loss (per window where the configurations "
             "were timed in interleaved windows).", "",
             "| norm | compiled | precision | batch x T | loss | run | ms/step | tokens/s | vs rmsnorm | MFU "
             "| peak GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in train:
        precision, loss, run = r.get("precision", "bf16-mixed"), r.get("loss_impl") or "plain", label(report_runs, r)
        shape = f"{r.get('batch', '?')} x {r.get('seq_len', '?')}"
        head = f"| {r['norm']} | {r['compiled']} | {precision} | {shape} | {loss} | {run}"
        if "error" in r:
            lines.append(f"{head} | FAIL: {r['error']} | | | | |")
            continue
        mfu = "n/a" if r.get("mfu") is None else f"{r['mfu']:.1%}" + (
            f" ({r['mfu_causal']:.1%} causal)" if r.get("mfu_causal") is not None else "")
        mem = "" if r.get("peak_mem_GiB") is None else f"{r['peak_mem_GiB']:.1f}"
        ms = f"{r['step_ms']:.1f}" + (f" {spread(r['window_ms'], '{:.1f}')}" if r.get("window_ms") else "")
        base = next((b for b in train if b["norm"] == "rmsnorm" and "error" not in b and b is not r
                     and key("train_step", {**b, "norm": r["norm"]}) == key("train_step", r)
                     and run_of(b)["id"] == run_of(r)["id"]), None)
        vs = "" if base is None else (lambda x: f"{statistics.median(x):.3f}x ({spread(x, '{:.3f}')})")(
            train_ratio(r, base))
        lines.append(f"{head} | {ms} | {r['tokens_per_s']:.0f} | {vs} | {mfu} | {mem} |")
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
                pts = sorted((r["hidden"], r.get(f"graph_{phase}_gbps") or r[f"{phase}_gbps"]) for r in ok
                             if r["M"] == m and r["provider"] == prov
                             and (r.get(f"graph_{phase}_gbps") or r.get(f"{phase}_gbps")) is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=prov)
            ax.axhline(copy, color="k", ls="--", lw=1, label="copy")
            if phase != "fwdbwd":  # bandwidth targets: fwd 90%, bwd alone 80% of copy
                ax.axhline((0.9 if phase == "fwd" else 0.8) * copy, color="gray", ls=":", lw=1, label="target")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{title}, M={m}")
            ax.set_xlabel("hidden")
            if j == 0:
                ax.set_ylabel("GB/s (byte model; graph replay where timed)")
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
