"""S12 round 2 (pre-registered): does the best learning rate transfer across width under muP, at the setting where
the standard drift is established? Yang et al. 2022 ("Tensor Programs V") report that under the maximal-update
parametrization (muP) an lr tuned at a small width carries over to larger ones. Round 1 could not test it: at its
cut-down budget (2 layers, 200 steps) the standard drift it needed as a premise was unresolved. S3 rounds 4-5
established that drift for RMSNorm at 4 layers and 400 steps (-0.42 decades per doubling, 95% CI [-0.48, -0.36],
widths 32-256); this round runs only the muP arm in that setting and reuses S3's committed standard runs as the
premise. The rules below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s3_lr_sensitivity.yaml (4 layers, 4 heads, 400 steps, batch 16 x 64 characters of
Shakespeare, no clipping), RMSNorm, no QK-norm, z-loss 0, model.parametrization=mup model.mup_base_width=32,
widths (model.dim) {32, 64, 128}, S3 round 5's lr grid {3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1}, seeds {0, ..., 4}:
90 runs (run.sh: the exact commands). The standard arm: S3 rounds 4-5's RMSNorm runs at widths 32-128, seeds 0-2
(experiments/studies/s3_lr_sensitivity/r5_width_low_lr/runs.jsonl, read as committed; no standard run is made).
Width 256 is left for a later round (30 runs of ~110 s each on one core).

Compute estimate (S3 round 5's wall times on this 2-core machine, one torch thread per run, two side by side:
11 s, 17 s and 37 s a run at widths 32, 64 and 128): 30 runs per width, ~1,950 CPU s, ~17 min.

Measures, per arm, width and seed: the best lr lr* (S3 round 4's parabola vertex through the grid's best point and
its neighbours on log10(lr), a diverged run at ln V; a grid edge when the best point is one); per arm and seed the
slope of log10(lr*) against log2(width) over widths 32-128 (decades per doubling).
Preconditions (the gates):
  R (the reuse; every hypothesis): muP at its base width is the standard model, so each muP run at width 32 of
    seeds 0-2 must give S3's standard run of the same (lr, seed) the same final val loss within REPRODUCE nats
    (18 pairs; a different number means the training changed between the commits, and S3's standard runs are then
    no premise for these: every hypothesis reads "not run: the standard runs do not reproduce").
  P (T1, T2): under the standard parametrization the best lr moves with width over widths 32-128: the 95% interval
    of the standard slope (3 seeds) wholly below -TOL. Absent: T1 and T2 read "premise absent at this scale".
  B (reported; S3 round 4's rule): muP's best lr lies inside the grid in each (width, seed) cell; a cell at a grid
    edge truncates its slope (the status says where).
Hypotheses (each read with its 95% interval; Holm across the three parts):
  T1 (the best lr transfers under muP): the muP slope (5 seeds) within +-TOL decades per doubling (two parts, at
     least -TOL and at most +TOL); "confirmed" when both hold, "not at this scale" when either fails, else
     "unresolved".
  T2 (muP removes most of the standard drift): muP's slope minus standard's, paired by seed (seeds 0-2, whose
     width-32 runs the two arms share), at least +REMOVES decades per doubling (about half of S3's -0.42).
Reported, not tested: per width the best seed-mean loss on the grid of muP and of standard and their paired
difference (round 1 saw muP trail by 0.12 nats at width 128 at 200 steps), the lr sensitivity, the max attention
logit. No comparison-engine verdict: this round's estimand is where each width's optimum lies, not a loss at a
chosen lr; a loss comparison at the lr a pilot chose would need fresh judged seeds (the two-stage design).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.machine import runs_commits, runs_machine
from experiments.common.study import Runs, analysis_main, ci, mean, paired, table
from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4
from experiments.studies.s3_lr_sensitivity.r5_width_low_lr import analyze as r5
from minillm.analysis.report import lr_sensitivity
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
STANDARD_RUNS = HERE.parents[1] / "s3_lr_sensitivity" / "r5_width_low_lr" / "runs.jsonl"
# --- fixed before the runs ---------------------------------------------------------------------------------
WIDTHS, LRS, BASE = (32, 64, 128), r5.LRS, 32
SEEDS = {"standard": (0, 1, 2), "mup": (0, 1, 2, 3, 4)}
TOL = 0.1  # decades of lr* per doubling (round 1's and S3 round 4's)
REMOVES = 0.2  # decades per doubling: about half of the standard drift S3 rounds 4-5 measured (-0.42)
REPRODUCE = 1e-6  # nats: the same model on the same data and seed gives the same loss
TAG = "s3_lr_sensitivity"  # the experiment's name: S3's setting


def arm_of(run: dict) -> str | None:
    if run.get("norm") != "rmsnorm" or (run.get("qk_norm") or "none") != "none" or run.get("z_loss"):
        return None
    return {"standard": "standard", "mup": "mup"}.get(run.get("parametrization") or "standard")


def standard_runs() -> Runs:
    rows = [json.loads(line) for line in STANDARD_RUNS.read_text().splitlines() if line.strip()]
    return Runs(r for r in rows if arm_of(r) == "standard" and r["dim"] in WIDTHS)


def grid(runs: Runs, arm: str, width: int, seed: int) -> dict[float, float] | None:
    """lr -> final val loss (diverged: ln V) of one (arm, width, seed), None unless the grid is complete."""
    losses = {r["lr"]: loss_for_comparison(r) for r in runs
              if arm_of(r) == arm and r["dim"] == width and r["seed"] == seed}
    return losses if sorted(losses) == sorted(LRS) else None


def reproduce_gate(mup: Runs, standard: Runs) -> dict:
    """R: muP at its base width against S3's standard runs, (lr, seed) by (lr, seed)."""
    gaps, missing = {}, []
    for s in SEEDS["standard"]:
        for lr in LRS:
            pair = [next((r for r in rs if r["dim"] == BASE and r["seed"] == s and r["lr"] == lr), None)
                    for rs in (mup, standard)]
            if None in pair or None in (pair[0].get("final_val_loss"), pair[1].get("final_val_loss")):
                missing.append(f"seed {s} lr {lr:g}")
                continue
            gaps[f"seed {s} lr {lr:g}"] = abs(pair[0]["final_val_loss"] - pair[1]["final_val_loss"])
    worst = max(gaps.values()) if gaps else None
    status = ("not recorded" if not gaps else "present" if worst <= REPRODUCE and not missing else "absent")
    block = pre.reported("S3's standard runs are this commit's standard model (muP at width 32 is standard)",
                         "largest |final val loss of muP - S3's standard| over the width-32 (lr, seed) pairs",
                         f"at most {REPRODUCE:g} nats in every pair", {"width 32": worst}, status,
                         f"{len(gaps)} pairs; missing: {', '.join(missing) or 'none'}")
    return {**block, "pairs": len(gaps), "missing": missing}


def best_and_slopes(runs: Runs, arm: str) -> tuple[dict, dict, list[bool]]:
    """(best log10 lr per (width, seed), slope per seed, bracketed per cell) of one arm."""
    best, slopes, bracketed = {}, {}, []
    with r5.six_point_grid():
        for s in SEEDS[arm]:
            points = []
            for w in WIDTHS:
                losses = grid(runs, arm, w, s)
                if losses is None:
                    continue
                x, ok = r4.best_log_lr([losses[lr] for lr in LRS])
                best[w, s] = x
                bracketed.append(ok)
                points.append((math.log2(w), x))
            if len(points) == len(WIDTHS):
                slopes[s] = r4.slope(*zip(*points, strict=True))
    return best, slopes, bracketed


def analyze(runs: Runs, standard: Runs | None = None) -> tuple[dict, str]:
    """The round's results from its muP runs and the standard arm's (default: S3's committed runs)."""
    mup = Runs(r for r in runs if arm_of(r) == "mup" and r.get("name") == TAG)
    prereg.require(mup, "the max attention logit (summary max_attn_logit)", lambda r: "max_attn_logit" in r)
    both = Runs([*mup, *(standard_runs() if standard is None else standard)])
    gate_r = reproduce_gate(mup, Runs(r for r in both if arm_of(r) == "standard"))
    best, slopes, bracketed = {}, {}, {}
    for arm in SEEDS:
        best[arm], slopes[arm], bracketed[arm] = best_and_slopes(both, arm)
    standard = pre.against(list(slopes["standard"].values()), -TOL, "at most")
    gate_p = pre.reported("the best lr moves with width under the standard parametrization (S3 rounds 4-5)",
                          "the standard slope of log10 lr* per doubling, widths 32-128, S3's runs (95% interval)",
                          f"the interval wholly below -{TOL:g}",
                          {"standard": standard["mean"]},
                          "present" if standard["reading"] == "holds" else "absent", "S3 round 5's committed runs")
    gate_p["interval"] = [standard["ci_low"], standard["ci_high"]]
    b = bracketed["mup"]
    gate_b = pre.reported("muP's best lr lies inside the grid (lr* measurable)", "muP cells (width, seed) whose best "
                          "lr is not a grid edge", "every cell", {"mup": f"{sum(b)}/{len(b)}"},
                          "present" if b and all(b) else "absent" if not any(b) else "mixed", "this round's runs")
    diff = prereg.diffs(slopes["mup"], slopes["standard"])
    holm = pre.parts({"T1 >= -TOL": (list(slopes["mup"].values()), -TOL, "at least"),
                      "T1 <= +TOL": (list(slopes["mup"].values()), TOL, "at most"),
                      "T2": (diff, REMOVES, "at least")})
    low, high = holm["parts"]["T1 >= -TOL"], holm["parts"]["T1 <= +TOL"]
    readings = {low["reading"], high["reading"]}
    t1 = "confirmed" if readings == {"holds"} else "not at this scale" if "fails" in readings else "unresolved"
    t1_why = (f"muP slope, seed mean {low['mean']:+.3f} decades per doubling, 95% CI [{low['ci_low']:+.3f}, "
              f"{low['ci_high']:+.3f}] against +-{TOL:g} (per seed "
              f"{' / '.join(f'{v:+.3f}' for v in slopes['mup'].values())}; Holm-adjusted p {low['p_holm']:.3f} / "
              f"{high['p_holm']:.3f})") if low["ci_low"] is not None else "muP slope: no interval"
    t2, t2_why = (prereg.verdict_line("T2", holm["parts"]["T2"], "muP slope - standard slope, paired by seed")
                  if len(diff) >= 2 else ("unresolved", "T2: fewer than 2 seeds with both slopes"))
    not_run = ("not run: the standard runs do not reproduce" if gate_r["status"] != "present" else
               "not run: fewer than 2 muP seeds with every width" if len(slopes["mup"]) < 2 else None)
    verdicts = {name: (not_run or pre.gate(w, gate_p), why)
                for name, (w, why) in {"T1": (t1, t1_why), "T2": (t2, t2_why)}.items()}
    rows, observed = [], {}
    for w in WIDTHS:
        per_arm = {}
        for arm in SEEDS:
            cells = {s: grid(both, arm, w, s) for s in SEEDS[arm]}
            cells = {s: c for s, c in cells.items() if c is not None}
            logits = [r.get("max_attn_logit") for r in both if arm_of(r) == arm and r["dim"] == w
                      and isinstance(r.get("max_attn_logit"), (int, float))]
            per_arm[arm] = {s: min(c.values()) for s, c in cells.items()}
            rows.append([arm, w, len(cells), mean(10 ** best[arm][w, s] for s in cells if (w, s) in best[arm]),
                         mean(lr_sensitivity(c) for c in cells.values()), mean(per_arm[arm].values()),
                         max(logits) if logits else None])
        d = paired(per_arm["mup"], per_arm["standard"])
        observed[str(w)] = {"best_loss_mup_minus_standard": d}
    tab = table(["arm", "width", "seeds", "best lr (seed mean of the parabola vertex)", "lr sensitivity (nats)",
                 "best loss on the grid", "max attention logit"], rows, digits=4)
    obs = "; ".join(f"width {w}: {o['best_loss_mup_minus_standard']['diff']:+.3f} "
                    f"{ci(o['best_loss_mup_minus_standard'])}" for w, o in observed.items())
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    standard_arm = [r for r in both if arm_of(r) == "standard"]
    md = (f"Machine: this round's muP runs: {runs_machine(mup)} (commit {runs_commits(mup)}); the standard arm, S3's: "
          f"{runs_machine(standard_arm)} (commit {runs_commits(standard_arm)}).\n\n"
          f"lr grid: {', '.join(f'{lr:g}' for lr in LRS)}; muP seeds 0-4 (this round), standard seeds 0-2 (S3 "
          f"rounds 4-5).\n\n{tab}\n\n{pre.line(gate_r)}\n\n{pre.line(gate_p)} Its 95% interval: "
          f"[{standard['ci_low']:+.3f}, {standard['ci_high']:+.3f}] (per seed "
          f"{' / '.join(f'{v:+.3f}' for v in slopes['standard'].values())}).\n\n{pre.line(gate_b)}\n\n"
          f"### Verdicts (rules fixed before the runs; {holm['text']})\n\n{vt}\n\n"
          f"Reported, not tested: best loss on the grid, muP - standard, paired by seed (0-2): {obs}.\n")
    return {"best_log10_lr": {f"{a}/{w}/{s}": v for a, b_ in best.items() for (w, s), v in b_.items()},
            "slopes": slopes, "slope_diff": diff, "verdicts": verdicts, "precondition": [gate_r, gate_p, gate_b],
            "holm": holm, "observed": observed, "lrs": list(LRS)}, md


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: False, analyze, None, argv)


if __name__ == "__main__":
    main()
