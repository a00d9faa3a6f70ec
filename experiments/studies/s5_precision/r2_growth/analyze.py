"""S5 round 2, the Peri-LN growth test: does the residual stream grow with depth and with training under Pre-LN,
and does Peri-LN keep it in check? Pre-registered: the rules below were committed before any run of this round
(the README names the commit). Results go to this round's folder.

    # both stages, then this analysis (~45 min, 2 cores)
    python -m experiments.studies.s5_precision.r2_growth.analyze --run
    python -m experiments.studies.s5_precision.r2_growth.analyze --run --dry-run   # print the train.py commands only
    python -m experiments.studies.s5_precision.r2_growth.analyze logs/s5_precision/multiruns/growth_*   # or no argument

Stage 1 tunes the lr per placement: lr in LRS at L = TUNE_DEPTH, seed TUNE_SEED; the lowest comparison loss
(minillm.outcome.loss_for_comparison) wins. Stage 2 runs each placement at its lr, L in DEPTHS, SEEDS.
Model: S5's (RMSNorm, dim 64, GPT-2 init, 400 steps, warmup 40, no clipping); residual RMS after every block
(layer/<i>/resid_rms) logged every 10 steps.

Measures, per run that did not diverge (r_i = residual RMS after block i, i = 1..L, at the last logged step):
  depth growth     r_L / r_1
  training growth  max_i r_i at the end / max_i r_i at step EARLY (just after the lr warmup)
  shape            r_i against i fitted two ways, each by least squares on the relative error: exponential
                   (log r linear in i) and linear (r = a + b i, weights 1 / r_i^2). "exponential" when the
                   exponential fit's relative RSS is <= SHAPE x the linear fit's; "linear" when the reverse
                   holds; otherwise, or when even the worse fit's RMS relative error is < FLOOR, "either".
Hypotheses (Kim et al. 2025, Peri-LN; Sun et al. 2025, The Curse of Depth in LLMs):
  G1 Pre-LN's depth growth is >= GROWTH x Peri-LN's (means over seeds). Confirmed: at every L >= 12; partly: at
     some; not at this scale: at none.
  G2 Pre-LN's depth growth rises with depth: at L = 48 it is >= GROWTH x that at L = 6 (means over seeds).
     Confirmed / not at this scale.
  G3 Pre-LN's profile is exponential and Peri-LN's is not, at L >= 24, every seed. Confirmed: both; partly: one.
  G4 Pre-LN's training growth is >= GROWTH x Peri-LN's (means over seeds). Confirmed: at every L; partly: some.
  L  Peri-LN trains better than Pre-LN at depth: mean val loss lower by >= LOSS_GAP at L >= 24. Confirmed: at
     both; partly: at one; not at this scale: at none.
  Control: Post-LN's depth growth lies in [1 / GROWTH, GROWTH] at every L (the residual stream is renormalized
     after every sublayer).
The shape fit is a least-squares fit (numpy), not a comparison. Beside L's rule, not part of it: the 95% paired t
interval of Pre - Peri over the seeds (minillm.analysis.stats.paired_t).

Added after the data (experiments.common.precondition; the rules above are unchanged):
  precondition  stream_growth on the Pre-LN runs ((r_L / r_1) / sqrt(L) per depth and seed): the growth Peri-LN
     is claimed to curb. Where it is absent at every depth, G1, G2, G3 and L read PREMISE_ABSENT (their rule's
     word in the text). massive_activations (max |h| / median |h|) was not recorded: the runs logged the residual
     RMS per block and max |h| over the run, whose ratio (an outlier ratio over RMS, not over the median) is
     given as a proxy that decides nothing.
  Holm  G1 (Pre / Peri depth growth per seed, log scale), G4 (Pre / Peri training growth, log scale) and L (Pre -
     Peri val loss) as thresholds on per-seed values, Holm-adjusted across the nine parts; G4 is graded by the
     parts that hold after the adjustment. G4's text gives each placement's own training growth.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from experiments.common import precondition as pre
from experiments.common.layout import ROOT
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, by_seed, ci, load, mean, paired, table, write
from minillm.metrics import VAL_LOSS, parse_metric
from minillm.outcome import final_loss, loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
PLACEMENTS = ("pre", "peri", "post")
DEPTHS = (6, 12, 24, 48)
LRS = (1e-3, 3e-3, 1e-2)
TUNE_DEPTH, TUNE_SEED = 12, 0
SEEDS = (0, 1)
EARLY = 50  # steps: the first logged step after the 40-step warmup
GROWTH = 2.0  # "exceeds" / "rises" / Post-LN "flat" factor
SHAPE = 0.5  # relative-RSS ratio that decides exponential vs linear
LOSS_GAP = 0.02  # nats
FLOOR = 0.01  # both fits within 1% RMS relative error: the shapes cannot be told apart


def resid_layer(key: str) -> int | None:
    parsed = parse_metric(key)
    return int(parsed[1]) if parsed and parsed[0] == "layer" and parsed[2] == "resid_rms" else None


def profile(run: dict, step: int | None = None) -> list[float]:
    """r_1..r_L at the logged step nearest `step` (None: the last one); [] when nothing was logged."""
    curves = sorted(((resid_layer(k), pts) for k, pts in run["curves"].items() if resid_layer(k) is not None),
                    key=lambda kv: kv[0])
    if not curves or not curves[0][1]:
        return []
    steps = [s for s, _ in curves[0][1]]
    at = steps[-1] if step is None else min(steps, key=lambda s: abs(s - step))
    return [dict(pts).get(at, math.nan) for _, pts in curves]


def fits(r: Sequence[float]) -> tuple[float, float]:
    """Relative RSS of the exponential and of the linear fit of r against i = 1..L (docstring)."""
    r = np.asarray(r, dtype=float)
    i = np.arange(1, len(r) + 1, dtype=float)
    b, a = np.polyfit(i, np.log(r), 1)
    rss_exp = float(np.sum((np.exp(a + b * i) / r - 1) ** 2))
    design = np.stack([np.ones_like(i), i], axis=1) / r[:, None]  # rows scaled by 1 / r_i: relative error
    coef, *_ = np.linalg.lstsq(design, np.ones_like(r), rcond=None)
    rss_lin = float(np.sum((design @ coef - 1) ** 2))
    return rss_exp, rss_lin


def shape(r: Sequence[float]) -> str:
    rss_exp, rss_lin = fits(r)
    if max(rss_exp, rss_lin) < FLOOR ** 2 * len(r):
        return "either"
    return "exponential" if rss_exp <= SHAPE * rss_lin else "linear" if rss_lin <= SHAPE * rss_exp else "either"


def measures(run: dict) -> dict | None:
    end, early = profile(run), profile(run, EARLY)
    if run.get("diverged") or not end or not all(math.isfinite(v) and v > 0 for v in end + early):
        return None
    rss_exp, rss_lin = fits(end)
    return {"depth_growth": end[-1] / end[0], "train_growth": max(end) / max(early), "shape": shape(end),
            "rss_exp": rss_exp, "rss_lin": rss_lin, "profile": end}


def is_tuning(run: dict) -> bool:
    return "growth_tune" in (run.get("tags") or [])


def tuned_lr(runs: Runs, placement: str) -> float:
    tune = [r for r in runs if is_tuning(r) and r["placement"] == placement and r["n_layers"] == TUNE_DEPTH
            and r["seed"] == TUNE_SEED]
    return min(tune, key=loss_for_comparison)["lr"]


def analyze(runs: Runs) -> tuple[dict, str]:
    main = [r for r in runs if not is_tuning(r)]
    cells = {}
    for p in PLACEMENTS:
        for L in DEPTHS:
            rs = sorted((r for r in main if r["placement"] == p and r["n_layers"] == L), key=lambda r: r["seed"])
            ms = [measures(r) for r in rs]
            ok = [m for m in ms if m]
            cells[p, L] = {"runs": len(rs), "lr": rs[0]["lr"] if rs else None,
                           "diverged": sum(bool(r.get("diverged")) for r in rs),
                           "val": mean(final_loss(r) for r in rs),
                           "depth_growth": mean(m["depth_growth"] for m in ok),
                           "train_growth": mean(m["train_growth"] for m in ok),
                           "shapes": [m["shape"] if m else "diverged" for m in ms]}
    rows = [[p, L, c["lr"], c["val"], c["depth_growth"], c["train_growth"], " / ".join(c["shapes"]), c["diverged"]]
            for (p, L), c in cells.items()]
    tab = table(["placement", "L", "lr (tuned)", "val loss", "depth growth r_L / r_1", "training growth",
                 "shape per seed", "diverged"], rows)

    def ratio(key: str, L: int) -> float | None:
        a, b = cells["pre", L][key], cells["peri", L][key]
        return a / b if a is not None and b else None

    def graded(hits: list, total: int) -> str:
        return "confirmed" if len(hits) == total else "partly" if hits else "not at this scale"

    deep = [L for L in DEPTHS if L >= 12]
    g1 = [L for L in deep if (ratio("depth_growth", L) or 0) >= GROWTH]
    pre6, pre48 = cells["pre", DEPTHS[0]]["depth_growth"], cells["pre", DEPTHS[-1]]["depth_growth"]
    rise = pre48 / pre6 if pre6 and pre48 else None
    deeper = [L for L in DEPTHS if L >= 24]
    pre_exp = all(s == "exponential" for L in deeper for s in cells["pre", L]["shapes"])
    peri_not = all(s not in ("exponential", "diverged") for L in deeper for s in cells["peri", L]["shapes"])
    g4 = [L for L in DEPTHS if (ratio("train_growth", L) or 0) >= GROWTH]
    gaps = {L: (cells["pre", L]["val"] - cells["peri", L]["val"]) if None not in (
        cells["pre", L]["val"], cells["peri", L]["val"]) else None for L in deeper}
    lhits = [L for L, g in gaps.items() if g is not None and g >= LOSS_GAP]
    gap_t = {L: paired(*(by_seed((r for r in main if r["placement"] == p and r["n_layers"] == L), final_loss)
                         for p in ("pre", "peri"))) for L in deeper}
    post_flat = all(c["depth_growth"] is not None and 1 / GROWTH <= c["depth_growth"] <= GROWTH
                    for (p, _), c in cells.items() if p == "post")
    gates = preconditions(main)
    holm = holm_parts(main)
    g4_holm = sum(r["significant"] for k, r in holm["parts"].items() if k.startswith("G4"))
    own = {p: [cells[p, L]["train_growth"] for L in DEPTHS] for p in ("pre", "peri")}
    own_text = "; ".join(f"{p}-LN's own {min(v):.2f}-{max(v):.2f}" for p, v in own.items() if None not in v)
    fmt = lambda d: ", ".join(f"L={L}: {v:.2f}" if v is not None else f"L={L}: -" for L, v in d.items())  # noqa: E731
    words = {"G1": graded(g1, len(deep)), "G2": "confirmed" if rise and rise >= GROWTH else "not at this scale",
             "G3": graded([x for x in (pre_exp, peri_not) if x], 2), "L": graded(lhits, len(deeper))}
    verdicts = {
        "G1": (pre.gate(words["G1"], *gates), f"by its rule: {words['G1']}; Pre / Peri depth growth " + fmt(
            {L: ratio("depth_growth", L) for L in deep}) + f"; {pre.count(holm, 'G1')}"),
        "G2": (pre.gate(words["G2"], *gates), f"by its rule: {words['G2']}; " +
               (f"Pre-LN depth growth L=48 / L=6: {rise:.2f}" if rise else "missing")),
        "G3": (pre.gate(words["G3"], *gates), f"by its rule: {words['G3']}; Pre-LN exponential at L>=24 in every "
               f"seed: {pre_exp}; Peri-LN not exponential: {peri_not}"),
        "G4": (graded(list(range(g4_holm)), len(DEPTHS)), f"{pre.count(holm, 'G4')}; by its rule: "
               f"{graded(g4, len(DEPTHS))}; Pre / Peri training growth " + fmt({L: ratio("train_growth", L)
                                                                              for L in DEPTHS}) +
               f" ({own_text}: Pre-LN's stream grows about 2x after warmup, Peri-LN's shrinks from its step-{EARLY} "
               "size)"),
        "L": (pre.gate(words["L"], *gates), f"by its rule: {words['L']}; Pre - Peri val loss " + fmt(gaps) +
              "; 95% CI (paired t) " + ", ".join(f"L={L}: {ci(t, 2)}" for L, t in gap_t.items()) +
              f"; {pre.count(holm, 'L ')}"),
        "control": ("holds" if post_flat else "fails", "Post-LN depth growth within "
                    f"[{1 / GROWTH:g}, {GROWTH:g}] at every L: {post_flat}"),
    }
    lrs = {p: cells[p, DEPTHS[0]]["lr"] for p in PLACEMENTS}
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    lines = "\n\n".join(pre.line(g) for g in gates)
    md = (f"Machine: {runs_machine(runs)}. {len(runs)} runs ({len(main)} in stage 2). Tuned lr: "
          + ", ".join(f"{p} {lr:g}" for p, lr in lrs.items() if lr) + f" (tuned on seed {TUNE_SEED} at L = "
          f"{TUNE_DEPTH} only).\n\n{tab}\n\n{lines}\n\n### Verdicts (rules fixed before the runs; the precondition "
          f"gate and Holm's adjustment added after the data)\n\n{vt}\n")
    return {"cells": [{"placement": p, "n_layers": L, **c} for (p, L), c in cells.items()],
            "verdicts": verdicts, "precondition": gates, "holm": holm, "machine": runs_machine(runs)}, md


def preconditions(main: Sequence[dict]) -> list[dict]:
    """stream_growth measured on the Pre-LN runs; massive_activations not recorded (its proxy given)."""
    pre_runs = sorted((r for r in main if r["placement"] == "pre"), key=lambda r: (r["n_layers"], r["seed"]))
    growth = {f"L={L}": [m["depth_growth"] / math.sqrt(L) for r in pre_runs if r["n_layers"] == L
                         if (m := measures(r))] for L in DEPTHS}
    proxy = {f"L={L}": mean(r["max_abs_h"] / profile(r)[-1] for r in pre_runs
                            if r["n_layers"] == L and r.get("max_abs_h") and profile(r)) for L in DEPTHS}
    return [pre.measure("stream_growth", growth, "layer/<i>/resid_rms at the last logged step, stage 2's Pre-LN runs"),
            pre.not_recorded("massive_activations", "the median of |h| was not logged", proxy,
                             "max |h| over the run / RMS after the last block at the end, seed mean")]


def holm_parts(main: Sequence[dict]) -> dict:
    """G1, G4 and L as thresholds on per-seed values (Pre against Peri, paired by seed), Holm-adjusted together."""
    by = {(r["placement"], r["n_layers"], r["seed"]): r for r in main}
    named = {}
    for L in DEPTHS:
        seeds = [s for s in SEEDS if ("pre", L, s) in by and ("peri", L, s) in by]
        m = {s: (measures(by["pre", L, s]), measures(by["peri", L, s])) for s in seeds}
        ok = [s for s in seeds if None not in m[s]]
        if L >= 12:
            named[f"G1 L={L}"] = ([m[s][0]["depth_growth"] / m[s][1]["depth_growth"] for s in ok], GROWTH,
                                  "at least", True)
        named[f"G4 L={L}"] = ([m[s][0]["train_growth"] / m[s][1]["train_growth"] for s in ok], GROWTH, "at least",
                              True)
        if L >= 24:
            named[f"L L={L}"] = ([final_loss(by["pre", L, s]) - final_loss(by["peri", L, s]) for s in seeds],
                                 LOSS_GAP, "at least")
    return pre.parts(named)


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    main = [r for r in runs if not is_tuning(r)]
    fig, axes = plt.subplots(1, len(PLACEMENTS), figsize=(13, 3.8), sharey=True)
    for ax, p in zip(axes, PLACEMENTS, strict=True):
        for j, L in enumerate(DEPTHS):
            for k, r in enumerate(r for r in main if r["placement"] == p and r["n_layers"] == L):
                prof = profile(r)
                if prof:
                    ax.plot(range(1, len(prof) + 1), prof, color=f"C{j}", ls="-" if r["seed"] == SEEDS[0] else "--",
                            label=f"L={L}" if k == 0 else None)
        ax.set(yscale="log", xlabel="block i", title=f"{p}-LN: residual RMS after block i (end; seeds: - / --)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("residual RMS")
    save(fig, out / "growth.png")


def sweep(stage: str, stamp: str, *overrides: str, jobs: int = 2) -> tuple[list[str], Path]:
    folder = ROOT / f"logs/s5_precision/multiruns/growth_{stage}_{stamp}"
    return ([sys.executable, "train.py", "-m", "experiment=s5_precision", "hydra/launcher=joblib",
             f"hydra.launcher.n_jobs={jobs}", f"hydra.sweep.dir={folder}", "trainer.max_steps=400",
             "trainer.log_every_n_steps=10", f"tags=[growth_{stage}]", *overrides], folder)


def run(dry: bool) -> list[Path]:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    csv = lambda xs: ",".join(f"{x:g}" for x in xs)  # noqa: E731
    tune = sweep("tune", stamp, f"placement={','.join(PLACEMENTS)}", f"model.n_layers={TUNE_DEPTH}",
                 f"optimizer.lr={csv(LRS)}", f"seed={TUNE_SEED}")
    print(" ".join(tune[0][1:]), flush=True)
    if not dry:
        subprocess.run(tune[0], cwd=ROOT, check=True)
    folders = [tune[1]]
    for p in PLACEMENTS:
        lr = 3e-3 if dry else tuned_lr(load(HERE, [str(tune[1])], lambda k: False, out=ROOT / "logs" / "growth"), p)
        cmd, folder = sweep(p, stamp, f"placement={p}", f"optimizer.lr={lr:g}",
                            f"model.n_layers={csv(sorted(DEPTHS, reverse=True))}", f"seed={csv(SEEDS)}")
        print(" ".join(cmd[1:]), flush=True)
        if not dry:
            subprocess.run(cmd, cwd=ROOT, check=True)
        folders.append(folder)
    return folders


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="*", help="the stage folders; none: the committed runs")
    ap.add_argument("--out", type=Path, help="folder for the results; default: this round's folder")
    ap.add_argument("--run", action="store_true", help="run both stages first, then analyze them")
    ap.add_argument("--dry-run", action="store_true", help="with --run: print the commands only")
    args = ap.parse_args(argv)
    sweeps = [str(f) for f in run(args.dry_run)] if args.run else args.sweeps
    if args.dry_run:
        return
    out = args.out or HERE
    runs = load(HERE, sweeps, lambda k: k == VAL_LOSS or resid_layer(k) is not None, out)
    results, md = analyze(runs)
    write(out, results, md)
    plot(runs, out)


if __name__ == "__main__":
    main()
