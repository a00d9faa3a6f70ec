"""S12 round 1: does the best learning rate transfer across width under muP, and does the norm or QK-norm change
that? Yang et al. 2022 ("Tensor Programs V") report that under the maximal-update parametrization (muP) the loss-vs-lr
curves of Transformers of growing width line up, so an lr tuned at a small width carries over; S3 rounds 4-5 found
that under the standard parametrization it does not (the best lr falls ~0.4 decades per doubling of width, 32-256).
The rules below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s12_mup.yaml (S3's CPU study cut to its cost: 2 layers, 4 heads, 200 steps, 20 warmup
steps, batch 16 x 64 characters, no clipping, the final validation only, one torch thread per run), widths
(model.dim) {32, 64, 128}, lr {1e-3, 3e-3, 1e-2, 3e-2, 1e-1} (brackets both standard's best lr, 1.5e-2 at width 32
falling to ~2.5e-3 at 128 by S3 r5's slope, and muP's, which should stay near width 32's), seeds {0, 1, 2}, muP's base
width 32 (where muP and standard are the same model), four arms:
  standard  RMSNorm, standard parametrization (the premise)
  mup       RMSNorm, model.parametrization=mup
  mup+qk    RMSNorm, muP, model.qk_norm=layernorm (S3 r6's QK-norm)
  mup-ln    LayerNorm, muP (run last; left out if the budget runs out, and then N reads "not run")
45 runs per arm, 180 in all: experiments/studies/s12_mup_transfer/r1_transfer/run.sh (the exact commands, the
standard arm first).

Compute estimate (the pilot, one process with one thread on the 2-core VM under other load: 10.5 s and 17 s a run
at widths 32 and 128 for 150 steps, ~20 s of start-up per sweep): ~17 s a run at 200 steps, ~50 min for 180 runs on
one core.

Measures, per arm, width and seed: the best lr lr* (S3 round 4's parabola vertex through the grid's best point and
its neighbours on log10(lr); a grid edge when the best point is one) and the lr sensitivity (minillm.analysis.report
.lr_sensitivity: the mean over the grid of the final val loss minus the grid's best, a diverged run at ln V); per
arm and seed, the slope of log10(lr*) against log2(width) (decades per doubling).
Precondition (the gates):
  P (T1, N): under the standard parametrization the best lr moves with width: the 95% interval of the standard
    arm's slope lies wholly below -TOL. Absent: T1 and N read "premise absent at this scale".
  L (Q, per width; S3 round 1's rule): attention logits grow without QK-norm: the max attention logit over the
    grid and seeds of mup over mup+qk at least LOGIT_GROWTH. Absent at a width: Q there reads premise absent.
Hypotheses (3 seeds, paired by seed; each part read with its 95% interval, Holm-adjusted p across all parts):
  T1 (the best lr transfers under muP): the mup arm's slope within +-TOL decades per doubling (two parts: at least
     -TOL, at most +TOL); "confirmed" when both intervals clear, "not at this scale" when either lies wholly on the
     wrong side, else "unresolved".
  N (the norm does not change that): the mup-ln slope minus the mup slope within +-TOL (two parts, read as T1).
  Q (per width; QK-norm still lowers the lr sensitivity under muP): sensitivity mup+qk / mup at most LOWER (ratio,
     log scale; S3 r6's rule).
Through the comparison engine (verdicts.json; plan.yaml, recorded as plan.json before the runs): mup+qk against mup
per width at the tuned lr, with the stability verdict (lr sensitivity, trainable lr range, failure rate).
Reported, not tested: the mup+qk slope; per width the best seed-mean loss of mup against standard.
An arm not run (the budget) leaves its hypotheses "not run" and, for mup+qk, no engine verdicts (this reading of a
missing arm was added after the pre-registration and before any muP run was analyzed; no rule changed).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, load, mean, parse_args, table, write, write_verdicts
from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4
from minillm.analysis import plans
from minillm.analysis.compare import compare
from minillm.analysis.report import lr_sensitivity
from minillm.analysis.rules import Rules
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
WIDTHS, SEEDS, BASE = (32, 64, 128), (0, 1, 2), 32
LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
ARMS = {"standard": ("standard", "rmsnorm", "none"), "mup": ("mup", "rmsnorm", "none"),
        "mup+qk": ("mup", "rmsnorm", "layernorm"), "mup-ln": ("mup", "layernorm", "none")}
TOL = 0.1  # decades of lr* per doubling of width (S3 r4's +-0.1 for a slope difference; standard's is ~-0.4)
LOWER = 0.8  # S3 round 1's: a mitigation lowers the sensitivity when it is at most 0.8x without it
LOGIT_GROWTH = 10.0  # S3 round 1's: logits grow without QK-norm when their max is at least 10x the QK-norm one
TAG = "mup_transfer"


def arm_of(run: dict) -> str | None:
    key = (run.get("parametrization") or "standard", run.get("norm"), run.get("qk_norm") or "none")
    return next((a for a, k in ARMS.items() if k == key), None)


def cell(runs: Runs, arm: str, width: int, seed: int) -> dict[float, float] | None:
    """lr -> final val loss (diverged: ln V) of one (arm, width, seed), None unless the grid is complete."""
    losses = {r["lr"]: loss_for_comparison(r) for r in runs
              if arm_of(r) == arm and r["dim"] == width and r["seed"] == seed}
    return losses if sorted(losses) == sorted(LRS) else None


def best_log_lr(losses: dict[float, float]) -> tuple[float, bool]:
    """(log10 of the best lr, bracketed): round 4's parabola vertex, on this round's grid."""
    saved, r4.LRS = r4.LRS, LRS
    try:
        return r4.best_log_lr([losses[lr] for lr in LRS])
    finally:
        r4.LRS = saved


def within(name: str, values: Sequence[float], holm: dict) -> tuple[str, str]:
    """The word of "the seed mean of values lies within +-TOL" from its two one-sided parts in ``holm``."""
    low, high = holm["parts"][f"{name} >= -TOL"], holm["parts"][f"{name} <= +TOL"]
    readings = {low["reading"], high["reading"]}
    word = ("confirmed" if readings == {"holds"} else "not at this scale" if "fails" in readings else "unresolved")
    ci = "no interval" if low["ci_low"] is None else f"95% CI [{low['ci_low']:+.3f}, {low['ci_high']:+.3f}]"
    return word, (f"{name}: seed mean {low['mean']:+.3f} decades per doubling, {ci} against +-{TOL:g} (per seed "
                  f"{' / '.join(f'{v:+.3f}' for v in values)}; Holm-adjusted p {low['p_holm']:.3f} / "
                  f"{high['p_holm']:.3f})")


def engine(runs: Runs) -> dict:
    """mup+qk against mup per width by the comparison engine, graded by the plan recorded before the runs."""
    record = plans.read_record(HERE / "plan.json")
    records = [{k: v for k, v in r.items() if k != "curves"} for r in runs if arm_of(r) in ("mup", "mup+qk")]
    here = HERE.relative_to(HERE.parents[3])  # the files are named from the repository root in verdicts.json
    rules, kept, check, info = plans.grade(record, records, here / "plan.json")
    committed = hashlib.sha256((HERE / "plan.yaml").read_bytes()).hexdigest()  # the plan file beside this one
    info.update(plan_file=str(here / "plan.yaml"), plan_file_changed=committed != record["plan_sha256"])
    return plans.apply(compare(kept, rules=Rules(**rules), run_check=check), info)


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = Runs(r for r in runs if TAG in (r.get("tags") or []) and arm_of(r) is not None)
    prereg.require(runs, "the max attention logit (summary max_attn_logit)", lambda r: "max_attn_logit" in r)
    star, edge, sens = {}, {}, {}
    for a in ARMS:
        for w in WIDTHS:
            for s in SEEDS:
                losses = cell(runs, a, w, s)
                if losses is not None:
                    (star[a, w, s], inside), sens[a, w, s] = best_log_lr(losses), lr_sensitivity(losses)
                    edge[a, w, s] = not inside

    def slopes(a: str) -> dict[int, float]:
        out = {}
        for s in SEEDS:
            if all((a, w, s) in star for w in WIDTHS):
                out[s] = r4.slope([math.log2(w) for w in WIDTHS], [star[a, w, s] for w in WIDTHS])
        return out

    slope = {a: slopes(a) for a in ARMS}
    std = list(slope["standard"].values())
    moved = pre.against(std, -TOL, "at most") if len(std) >= 2 else None
    gate_p = pre.reported("under the standard parametrization the best lr moves with width (S3 r4-r5)",
                          "slope of log10(lr*) against log2(width), standard arm, decades per doubling",
                          f"95% interval wholly below -{TOL:g}", {"standard": moved and moved["mean"]},
                          "present" if moved and moved["reading"] == "holds" else "absent",
                          "this round's runs")

    def top_logit(a: str, w: int) -> float:
        return max((r.get("max_attn_logit") or 0.0 for r in runs if arm_of(r) == a and r["dim"] == w), default=0.0)

    growth = {f"width {w}": top_logit("mup", w) / top_logit("mup+qk", w) if top_logit("mup+qk", w) else None
              for w in WIDTHS}
    gate_l = pre.reported("attention logits grow without QK-norm under muP (QK-norm's problem)",
                          "max attention logit over the grid and seeds, mup / mup+qk", f"at least {LOGIT_GROWTH:g}",
                          growth, "mixed", "this round's runs (max_attn_logit)")
    for name, value in growth.items():
        gate_l["cells"][name]["status"] = ("not recorded" if value is None else
                                           "present" if value >= LOGIT_GROWTH else "absent")
    gate_l["status"] = pre.overall(c["status"] for c in gate_l["cells"].values())

    by_seed = {f"{a}/{w}": {s: sens[a, w, s] for s in SEEDS if (a, w, s) in sens} for a in ARMS for w in WIDTHS}
    norm_gap = prereg.diffs(slope["mup-ln"], slope["mup"])
    spec = {}
    if slope["mup"]:
        spec |= {"T1 >= -TOL": (list(slope["mup"].values()), -TOL, "at least"),
                 "T1 <= +TOL": (list(slope["mup"].values()), TOL, "at most")}
    if norm_gap:
        spec |= {"N >= -TOL": (norm_gap, -TOL, "at least"), "N <= +TOL": (norm_gap, TOL, "at most")}
    qk_ratios = {w: prereg.ratios(by_seed[f"mup+qk/{w}"], by_seed[f"mup/{w}"]) for w in WIDTHS}
    for w in WIDTHS:
        if qk_ratios[w]:
            spec[f"Q width {w}"] = (qk_ratios[w], LOWER, "at most", True)
    holm = pre.parts(spec)
    verdicts = {"T1": ("not run", "the mup arm was not run")}
    if slope["mup"]:
        word, why = within("T1", list(slope["mup"].values()), holm)
        verdicts["T1"] = (pre.gate(word, gate_p), why)
    if norm_gap:
        word, why = within("N", norm_gap, holm)
        verdicts["N"] = (pre.gate(word, gate_p), why)
    else:
        verdicts["N"] = ("not run", "the mup-ln arm was not run (the budget)")
    for w in WIDTHS:
        if not qk_ratios[w]:
            verdicts[f"Q width {w}"] = ("not run", "the mup+qk arm was not run at this width (the budget)")
            continue
        word, why = prereg.verdict_line(f"Q width {w}", holm["parts"][f"Q width {w}"],
                                        "lr sensitivity mup+qk / mup")
        verdicts[f"Q width {w}"] = (pre.gate(word, pre.cell(gate_l, f"width {w}")), why)

    best = {f"{a}/{w}": min((mean(r_loss) for r_loss in _seed_losses(runs, a, w).values()), default=None)
            for a in ARMS for w in WIDTHS}
    rows = [[a, w, mean(10 ** star[a, w, s] for s in SEEDS if (a, w, s) in star),
             sum(edge.get((a, w, s), False) for s in SEEDS), mean(by_seed[f"{a}/{w}"].values()), best[f"{a}/{w}"],
             top_logit(a, w)] for a in ARMS for w in WIDTHS if any((a, w, s) in star for s in SEEDS)]
    tab = table(["arm", "width", "best lr (seed mean)", "seeds at a grid edge", "lr sensitivity (seed mean)",
                 "best seed-mean loss on the grid", "max attention logit"], rows, digits=4)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    reported = "; ".join(f"{a}: {mean(v.values()):+.3f} decades per doubling (per seed "
                         f"{' / '.join(f'{x:+.3f}' for x in v.values())})" for a, v in slope.items() if v)
    md = (f"Widths {', '.join(map(str, WIDTHS))}, lr grid {', '.join(f'{lr:g}' for lr in LRS)}, muP base width "
          f"{BASE}, {len(runs)} runs.\n\n{tab}\n\n{pre.line(gate_p)} {_interval(moved)}\n\n{pre.line(gate_l)}\n\n"
          f"### Verdicts (rules "
          f"fixed before the runs; {holm['text']})\n\n{vt}\n\nThe best lr's slope against log2(width), per arm: "
          f"{reported}.\n")
    return {"best_log10_lr": {f"{a}/{w}/{s}": v for (a, w, s), v in star.items()},
            "at_grid_edge": {f"{a}/{w}/{s}": v for (a, w, s), v in edge.items()},
            "sensitivity": by_seed, "lr_slopes": slope, "best_loss": best, "verdicts": verdicts,
            "precondition": [gate_p, gate_l], "holm": holm, "standard_slope": moved,
            "n_params": {str(w): _params(runs, w) for w in WIDTHS}}, md


def _interval(reading: dict | None) -> str:
    """The standard arm's slope with its 95% interval (what the gate read)."""
    if not reading or reading["ci_low"] is None:
        return ""
    return (f"The standard arm's slope: {reading['mean']:+.3f} decades per doubling, 95% CI "
            f"[{reading['ci_low']:+.3f}, {reading['ci_high']:+.3f}].")


def _seed_losses(runs: Runs, arm: str, width: int) -> dict[float, list[float]]:
    """lr -> the seeds' final val losses (diverged: ln V) of one arm and width."""
    out: dict[float, list[float]] = {}
    for r in runs:
        if arm_of(r) == arm and r["dim"] == width:
            out.setdefault(r["lr"], []).append(loss_for_comparison(r))
    return out


def _params(runs: Runs, width: int) -> int | None:
    return next((r.get("n_params") for r in runs if r["dim"] == width), None)


def main(argv: Sequence[str] | None = None) -> None:
    """analysis_main's steps; the engine's verdicts only where the mup+qk arm ran (it compares that arm)."""
    args = parse_args(__doc__, argv)
    out = args.out or HERE
    runs = load(HERE, args.sweeps, lambda k: False, out)
    write(out, *analyze(runs))
    if any(arm_of(r) == "mup+qk" for r in runs):
        write_verdicts(out, engine(runs))


if __name__ == "__main__":
    main()
