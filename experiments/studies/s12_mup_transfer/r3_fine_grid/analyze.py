"""S12 round 3 (pre-registered): does the best learning rate transfer across width under muP, measured finely enough
to say? Round 2 ran muP in S3 rounds 4-5's setting at widths 32-128 and found its loss-vs-lr curves on top of each
other, but its test of the transfer unresolved: muP's slope of the best lr was -0.049 decades per doubling, 95% CI
[-0.163, +0.066], against +-0.1. What left it open was the per-seed best lr: muP's curves have a flat floor between
1e-2 and 3e-2, on which each seed's parabola vertex scattered (sd 0.13-0.26 decades per width), with 5 seeds over two
doublings. A finer grid alone does not remove that scatter (on a flat floor the noise of the losses decides which
point is lowest); what narrows the slope's interval is the lever arm and the seeds: this round adds width 256 (three
doublings), runs 12 seeds, and steps the grid by a quarter decade (the vertex is then interpolated between closer
points, and the grid reaches a quarter decade lower than a margin-sized drift would take width 256). T1 is read as
the equivalence test it is, two one-sided tests at 5% each (a 90% interval). No power is claimed: round 2's scatter
leaves "unresolved" a likely outcome if muP's true slope lies near round 2's -0.05. The rules below are committed
before any run; the data commit cites this one.

Setting: round 2's: configs/experiment/s3_lr_sensitivity.yaml (4 layers, 4 heads, 400 steps, batch 16 x 64
characters of Shakespeare, no clipping), RMSNorm, no QK-norm, z-loss 0, model.parametrization=mup
model.mup_base_width=32, widths (model.dim) WIDTHS, lrs LRS (10^-2.75 to 10^-1.25 by quarter decades, written to
three figures), seeds SEEDS: 336 runs (run.sh beside this file: the exact commands; it takes the seeds of a piece,
so the round runs in pieces by seeds from one commit, each saved into parts/; a stopped piece continues where it
stopped when run again; the analysis then reads parts/*). The standard arm is S3 rounds 4-5's committed RMSNorm runs
at widths 32-256, seeds 0-2 (experiments/studies/s3_lr_sensitivity/r5_width_low_lr/runs.jsonl); no standard run is
made.

Compute estimate (S3 round 5's median wall times of its standard runs on this 2-core machine, one torch thread, two
side by side, ~11, 16, 38 and 104 s at widths 32, 64, 128 and 256, times round 2's muP / standard ratio of up to
1.8 at the small widths): ~1,700 CPU s per seed, ~3 h for 12 seeds with two processes, three pieces of 4 seeds.

Measures, per width and seed: the best lr lr* (S3 round 4's parabola vertex through the grid's best point and its
neighbours on log10(lr), a diverged or crashed run at ln V; an edge when the best point is one); per seed the slope of
log10(lr*) against log2(width) over WIDTHS (decades per doubling).
Preconditions (the gates):
  R (the reuse; T1): muP at its base width is the standard model, so each muP run at width 32, lr 1e-2 (the one lr
    both grids hold), seeds 0-2 must give S3's standard run of the same seed the same final val loss within
    REPRODUCE nats; otherwise S3's runs are no premise for these and T1 reads "not run: the standard runs do not
    reproduce". (It shows the training code has not changed since S3's runs; it does not rerun S3's wider ones.)
  P (T1): under the standard parametrization the best lr moves with width over WIDTHS: the 95% interval of the
    standard slope (S3's 3 seeds, its six-point grid) wholly below -TOL. Absent: T1 reads "premise absent at this
    scale". It is read on committed runs and known before this round (-0.420 [-0.481, -0.358], as S3 round 5
    reported): it cannot change with this round's runs.
  B (T1's "confirmed"): muP's best lr inside the grid in every (width, seed) cell. A cell at an edge truncates its
    seed's slope towards 0, towards "confirmed": with any such cell T1 reads at most "unresolved".
Hypothesis:
  T1 (the best lr transfers under muP): the muP slope over WIDTHS (12 seeds) within +-TOL decades per doubling,
     two one-sided tests at ALPHA each: "confirmed" when its 1 - 2 ALPHA (90%) t interval lies inside [-TOL, +TOL]
     (and gate B is present), "not at this scale" when that interval lies wholly outside it (below -TOL or above
     +TOL), "unresolved" otherwise. One hypothesis, so no adjustment.
Every run of the grid (WIDTHS x LRS x SEEDS) must be there and have ended; a missing one stops the analysis.
Reported, not tested: the muP slope over widths 32-128 (round 2's span) with its interval; per width the seed mean of
lr*, the lr sensitivity, the best loss on the grid (muP's on this finer grid is biased low against standard's on
S3's coarser one: not a like-for-like comparison) and the max attention logit; muP's slope minus standard's,
paired by seed (0-2), with its interval (round 2's T2; 3 pairs are too few to test it again).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.machine import runs_commits, runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, analysis_main, mean, table
from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4
from experiments.studies.s3_lr_sensitivity.r5_width_low_lr import analyze as s3
from experiments.studies.s12_mup_transfer.r2_transfer_400 import analyze as r2
from minillm.analysis.report import lr_sensitivity

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
WIDTHS, BASE = (32, 64, 128, 256), 32
LRS = (1.78e-3, 3.16e-3, 5.62e-3, 1e-2, 1.78e-2, 3.16e-2, 5.62e-2)  # 10^-2.75 ... 10^-1.25 by quarter decades
SEEDS = tuple(range(12))
ALPHA = 0.05  # each one-sided test of T1's equivalence
STANDARD_SEEDS, STANDARD_LRS = (0, 1, 2), s3.LRS  # S3 rounds 4-5's
SHARED_LR = 1e-2  # the one lr both grids hold: gate R compares there
TOL = 0.1  # decades of lr* per doubling (rounds 1-2's and S3 round 4's)
REPRODUCE = 1e-6  # nats: the same model on the same data and seed gives the same loss
TAG = "s3_lr_sensitivity"  # the experiment's name: S3's setting


arm_of = r2.arm_of  # "standard", "mup" or None (another norm, QK-norm or z-loss): round 2's arms


def standard_runs() -> Runs:
    """S3's committed standard RMSNorm runs at this round's widths."""
    rows = [json.loads(line) for line in r2.STANDARD_RUNS.read_text().splitlines() if line.strip()]
    return Runs(r for r in rows if arm_of(r) == "standard" and r["dim"] in WIDTHS)


def cell(runs: Runs, width: int, seed: int, lrs: Sequence[float]) -> dict[float, float] | None:
    """lr -> final val loss (diverged or crashed: ln V) of one (width, seed), None unless every lr of ``lrs`` ran."""
    losses = {lr: prereg.ended_loss(r) for r in runs for lr in lrs
              if r["dim"] == width and r["seed"] == seed and math.isclose(r["lr"], lr)}
    return losses if len(losses) == len(lrs) else None


def best_and_slopes(runs: Runs, seeds: Sequence[int], lrs: Sequence[float], widths: Sequence[int] = WIDTHS
                    ) -> tuple[dict, dict, list[bool]]:
    """(log10 lr* per (width, seed), slope per seed over ``widths``, bracketed per cell) of one arm's runs."""
    best, slopes, bracketed = {}, {}, []
    for s in seeds:
        points = []
        for w in widths:
            if (losses := cell(runs, w, s, lrs)) is None:
                continue
            x, ok = r4.best_log_lr([losses[lr] for lr in lrs], lrs)
            best[w, s] = x
            bracketed.append(ok)
            points.append((math.log2(w), x))
        if len(points) == len(widths):
            slopes[s] = r4.slope(*zip(*points, strict=True))
    return best, slopes, bracketed


def reproduce_gate(mup: Runs, standard: Runs) -> dict:
    """R: muP at its base width against S3's standard runs at the shared lr, seed by seed."""
    gaps, missing = {}, []
    for s in STANDARD_SEEDS:
        pair = [next((r for r in rs if r["dim"] == BASE and r["seed"] == s and math.isclose(r["lr"], SHARED_LR)
                      and r.get("final_val_loss") is not None), None) for rs in (mup, standard)]
        if None in pair:
            missing.append(f"seed {s}")
            continue
        gaps[f"seed {s}"] = abs(pair[0]["final_val_loss"] - pair[1]["final_val_loss"])
    worst = max(gaps.values()) if gaps else None
    status = "not recorded" if not gaps else "present" if worst <= REPRODUCE and not missing else "absent"
    return {**pre.reported("S3's standard runs are this commit's standard model (muP at width 32 is standard)",
                           f"largest |final val loss of muP - S3's standard| at width 32, lr {SHARED_LR:g}",
                           f"at most {REPRODUCE:g} nats for every seed", {"width 32": worst}, status,
                           f"{len(gaps)} seeds; missing: {', '.join(missing) or 'none'}"), "missing": missing}


def _interval(result: dict) -> str:
    return "no interval" if result["ci_low"] is None else f"[{result['ci_low']:+.3f}, {result['ci_high']:+.3f}]"


def _estimate(result: dict) -> str:
    return "no estimate" if result["mean"] is None else f"{result['mean']:+.3f} {_interval(result)}"


def analyze(runs: Runs, standard: Runs | None = None) -> tuple[dict, str]:
    """The round's results from its muP runs and the standard arm's (default: S3's committed runs)."""
    mup = Runs(r for r in runs if arm_of(r) == "mup" and r.get("name") == TAG)
    prereg.require(mup, "the max attention logit (summary max_attn_logit)", lambda r: "max_attn_logit" in r)
    prereg.require(mup, "an lr of the grid and a seed and width of this round",
                   lambda r: any(math.isclose(r["lr"], lr) for lr in LRS) and r["seed"] in SEEDS
                   and r["dim"] in WIDTHS)
    prereg.require_ended(mup)
    prereg.require_once(mup, lambda r: (r["dim"], round(math.log10(r["lr"]), 4), r["seed"]),
                        lambda k: f"width {k[0]} lr {10 ** k[1]:.3g} seed {k[2]}")
    have = {(r["dim"], lr, r["seed"]) for r in mup for lr in LRS if math.isclose(r["lr"], lr)}
    if missing := [f"width {w} lr {lr:g} seed {s}" for w in WIDTHS for lr in LRS for s in SEEDS
                   if (w, lr, s) not in have]:
        raise SystemExit(f"{len(missing)} of the round's {len(WIDTHS) * len(LRS) * len(SEEDS)} runs are missing: "
                         f"{', '.join(missing[:5])}; run.sh with their seeds runs them")
    std = Runs(r for r in (standard_runs() if standard is None else standard) if arm_of(r) == "standard")
    gate_r = reproduce_gate(mup, std)
    best, slopes, bracketed = best_and_slopes(mup, SEEDS, LRS)
    _, slopes_128, _ = best_and_slopes(mup, SEEDS, LRS, WIDTHS[:3])
    std_best, std_slopes, _ = best_and_slopes(std, STANDARD_SEEDS, STANDARD_LRS)
    standard_slope = pre.against(list(std_slopes.values()), -TOL, "at most")
    gate_p = pre.reported("the best lr moves with width under the standard parametrization (S3 rounds 4-5)",
                          f"the standard slope of log10 lr* per doubling, widths {WIDTHS[0]}-{WIDTHS[-1]}, S3's runs "
                          "(95% interval)", f"the interval wholly below -{TOL:g}", {"standard": standard_slope["mean"]},
                          "present" if standard_slope["reading"] == "holds" else "absent",
                          "S3 round 5's committed runs")
    gate_p["interval"] = [standard_slope["ci_low"], standard_slope["ci_high"]]
    gate_b = pre.reported("muP's best lr lies inside the grid (lr* measurable)", "muP cells (width, seed) whose best "
                          "lr is not a grid edge", "every cell", {"mup": f"{sum(bracketed)}/{len(bracketed)}"},
                          "present" if bracketed and all(bracketed) else "absent" if not any(bracketed) else "mixed",
                          "this round's runs")
    low = pre.against(list(slopes.values()), -TOL, "at least", 2 * ALPHA)
    high = pre.against(list(slopes.values()), TOL, "at most", 2 * ALPHA)
    readings = {low["reading"], high["reading"]}
    t1 = "confirmed" if readings == {"holds"} else "not at this scale" if "fails" in readings else "unresolved"
    if t1 == "confirmed" and gate_b["status"] != "present":  # an edge cell pulls its seed's slope towards 0
        t1 = "unresolved"
    t1_why = (f"muP slope over widths {WIDTHS[0]}-{WIDTHS[-1]}, seed mean {low['mean']:+.3f} decades per doubling, "
              f"{100 * (1 - 2 * ALPHA):g}% CI {_interval(low)} against +-{TOL:g} (per seed "
              f"{' / '.join(f'{v:+.3f}' for v in slopes.values())})") if len(slopes) >= 2 else "T1: no interval"
    not_run = ("not run: the standard runs do not reproduce" if gate_r["status"] != "present" else
               "not run: fewer than 2 muP seeds with every width" if len(slopes) < 2 else None)
    verdicts = {"T1": (not_run or pre.gate(t1, gate_p), t1_why)}
    span_128 = pre.against(list(slopes_128.values()), 0.0, "at most")
    diff = pre.against(prereg.diffs(slopes, std_slopes), 0.0, "at least")
    rows = []
    for w in WIDTHS:
        cells = {s: c for s in SEEDS if (c := cell(mup, w, s, LRS)) is not None}
        logits = [r["max_attn_logit"] for r in mup if r["dim"] == w and isinstance(r["max_attn_logit"], (int, float))]
        std_cells = [c for s in STANDARD_SEEDS if (c := cell(std, w, s, STANDARD_LRS)) is not None]
        rows.append([w, len(cells), mean(10 ** best[w, s] for s in cells), mean(lr_sensitivity(c) for c in
                     cells.values()), mean(min(c.values()) for c in cells.values()),
                     mean(10 ** std_best[w, s] for s in STANDARD_SEEDS if (w, s) in std_best),
                     mean(min(c.values()) for c in std_cells), max(logits) if logits else None])
    tab = table(["width", "muP seeds", "muP best lr (seed mean of the vertex)", "muP lr sensitivity (nats)",
                 "muP best loss on its finer grid", "standard best lr (S3)", "standard best loss on S3's coarser grid",
                 "muP max attention logit"], rows, digits=4)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"Machine: this round's runs: {runs_machine(mup)} (commit {runs_commits(mup)}); the standard arm, S3's: "
          f"{runs_machine(std)} (commit {runs_commits(std)}).\n\n"
          f"muP lr grid: {', '.join(f'{lr:g}' for lr in LRS)}; muP seeds {SEEDS[0]}-{SEEDS[-1]}; standard (S3): "
          f"{', '.join(f'{lr:g}' for lr in STANDARD_LRS)}, seeds 0-2.\n\n{tab}\n\n{pre.line(gate_r)}\n\n"
          f"{pre.line(gate_p)} Its 95% interval: {_interval(standard_slope)} (per seed "
          f"{' / '.join(f'{v:+.3f}' for v in std_slopes.values())}).\n\n{pre.line(gate_b)}\n\n"
          f"### Verdict (the rule fixed before the runs)\n\n{vt}\n\n"
          f"Reported, not tested: the muP slope over widths 32-128 (round 2's span), {_estimate(span_128)}; muP's "
          f"slope minus standard's over widths {WIDTHS[0]}-{WIDTHS[-1]}, paired by seed (0-2), {_estimate(diff)}.\n")
    return {"best_log10_lr": {f"{w}/{s}": v for (w, s), v in best.items()}, "slopes": slopes,
            "slopes_32_128": slopes_128, "standard_slopes": std_slopes, "t1": {"at least": low, "at most": high},
            "slope_32_128": span_128, "slope_diff": diff, "verdicts": verdicts,
            "precondition": [gate_r, gate_p, gate_b], "lrs": list(LRS)}, md


def plot(runs: Runs, out: Path) -> None:
    """Per width, muP's final val loss against the lr (seed mean, each seed a dot); lr* against the width, muP's
    seeds and S3's standard ones."""
    plt = pyplot()
    res, _ = analyze(runs)
    mup = Runs(r for r in runs if arm_of(r) == "mup" and r.get("name") == TAG)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, w in enumerate(WIDTHS):
        cells = [c for s in SEEDS if (c := cell(mup, w, s, LRS)) is not None]
        for c in cells:
            axes[0].scatter(LRS, [c[lr] for lr in LRS], color=f"C{i}", s=6, alpha=0.4)
        axes[0].plot(LRS, [mean(c[lr] for c in cells) for lr in LRS], "o-", color=f"C{i}", label=f"width {w}")
    axes[0].set(xscale="log", xlabel="lr", ylabel="final val loss (diverged: ln V)", title="muP, each seed a dot")
    axes[0].legend(fontsize=8)
    std_best, _, _ = best_and_slopes(standard_runs(), STANDARD_SEEDS, STANDARD_LRS)
    for name, best, color in (("muP", res["best_log10_lr"], "C0"),
                              ("standard (S3)", {f"{w}/{s}": v for (w, s), v in std_best.items()}, "C3")):
        pts = sorted((int(k.split("/")[0]), 10 ** v) for k, v in best.items())
        axes[1].scatter(*zip(*pts, strict=True), color=color, s=10, alpha=0.6, label=name)
    axes[1].set(xscale="log", yscale="log", xlabel="width", ylabel="best lr (parabola vertex)",
                title="the best lr per width and seed")
    axes[1].legend(fontsize=8)
    save(fig, out / "transfer.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: False, analyze, plot, argv)


if __name__ == "__main__":
    main()
