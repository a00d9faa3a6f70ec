"""S6 round 3 (pre-registered): is RMSNorm as good as LayerNorm in the CPU study's model, each at the lr
a 3-seed pilot chose? The two-stage design end to end (docs/comparing.md, "The two-stage design"): plan.yaml
recorded by minillm-plan before any run, a pilot over the lr grid, the freeze (each norm's lr, the pilot's spread,
the judged seeds the margin needs), fresh judged seeds at the frozen lrs only, graded as `minillm-report --plan`
grades them. The rules below are committed before any run; the data commit cites this one.

Claim (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", NeurIPS): re-centering is dispensable, so
RMSNorm, which only re-scales, reaches quality comparable to LayerNorm's while running 7%-64% faster. This round
tests the quality half (round 1 measured the cost); expected: equivalent.

Setting: `experiment=cpu_study threads=1` (dim 64, 4 layers, 4 heads, context 64, batch 16, 400 steps, warmup 40,
cosine, no clipping, Shakespeare characters; ~0.22M parameters, 1.8 tokens per parameter), Pre-LN, sweep
`name=s6_r3_rms_vs_ln`. The metric is the final val loss (the preset runs no test pass; `metric: auto` takes it).

Rules (plan.yaml beside this file, recorded as plan.json; the engine's, minillm's rules version 3 as they stand at
the freeze commit): lr grid 1e-3, 3e-3, 1e-2; pilot seeds 0-2 choose each norm's lr on the final val loss (a failed
run at ln V); judged seeds the first `seeds_needed` of 100-123 (at least 3), at the frozen lrs only; paired by seed;
margin 0.02 nats; alpha 0.05; failed runs penalized; TOST for equivalence. The verdict is the engine's word for
rmsnorm (minillm.analysis.plans.grade, minillm.analysis.compare.compare, minillm.analysis.plans.apply: what
`minillm-report logs/s6_r3_rms_vs_ln --plan` writes), its estimand "each arm at the lr a 3-seed pilot chose". A
breach of the frozen design marks it not pre-registered, and the finding says so.

Precondition (the gate, read first): both norms train and were tuned: each norm's pilot-chosen lr lies inside the
grid (not at its edge), and every judged run ends below the unigram loss. Absent: the word reads "premise absent at
this scale" and the engine's word stands beside it as an observation.

    bash experiments/studies/s6_cost/r3_two_stage/run.sh       # plan, pilot, freeze, judged runs, analysis

Compute: 18 pilot runs and 2 x seeds_needed judged runs of 400 steps, ~45 s each on one thread of the shared
2-core VM, one at a time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, analysis_main, fmt, mean, table
from minillm.analysis import plan_record, plans
from minillm.analysis.compare import compare
from minillm.analysis.rules import Rules
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
PLAN_JSON = HERE / "plan.json"  # the record minillm-plan wrote (logs/SWEEP/plan.json), committed with the freeze
PLAN_YAML = HERE / "plan.yaml"
# --- fixed before the runs (the same as plan.yaml; test_rules.py checks they agree) ----------------------------
SWEEP = "s6_r3_rms_vs_ln"
BASELINE, ARM = "layernorm", "rmsnorm"
NORMS = (BASELINE, ARM)
LRS = (1e-3, 3e-3, 1e-2)
PILOT_SEEDS = (0, 1, 2)
MARGIN = 0.02  # nats


def _same(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9)


def _lrs(frozen: dict) -> str:
    return ", ".join(f"{n} {frozen['lrs'][n]:g}" for n in NORMS)


def _ours(runs: Runs) -> Runs:
    return Runs(r for r in runs if r.get("name") == SWEEP and r.get("norm") in NORMS)


def record(path: Path | None = None) -> tuple[dict, dict, dict | None]:
    """(plan.json, its current plan stage, its freeze stage or None)."""
    rec = plans.read_record(path or PLAN_JSON)
    stage, frozen = plan_record.current(rec)
    return rec, stage, frozen


def engine(runs: Runs, path: Path | None = None) -> dict:
    """The verdict as `minillm-report --plan` gives it: the recorded plan's rules, the design verified, the judged
    runs compared (minillm.analysis.plans.grade / apply, minillm.analysis.compare.compare)."""
    path = path or PLAN_JSON
    rec, _, _ = record(path)
    records = [{k: v for k, v in r.items() if k != "curves"} for r in runs]
    try:
        shown = path.resolve().relative_to(HERE.parents[3])  # named from the repository root in verdicts.json
    except ValueError:
        shown = path
    rules, kept, check, info = plans.grade(rec, records, shown)
    committed = plan_record.sha256(PLAN_YAML.read_bytes())  # the plan file beside this one, not the recorded path
    info.update(plan_file=str(shown.parent / PLAN_YAML.name), plan_file_changed=committed != info["plan_hash"])
    return plans.apply(compare(kept, rules=Rules(**rules), run_check=check), info)


def pilot_table(runs: Runs) -> dict[str, dict[str, dict[int, float]]]:
    """norm -> lr -> seed -> final val loss (a failed run at ln V) of the pilot seeds."""
    return {n: {f"{lr:g}": {r["seed"]: loss_for_comparison(r) for r in runs if r["norm"] == n and _same(r["lr"], lr)
                            and r["seed"] in PILOT_SEEDS} for lr in LRS} for n in NORMS}


def analyze(runs: Runs, path: Path | None = None) -> tuple[dict, str]:
    runs = _ours(runs)
    _, stage, frozen = record(path)
    if frozen is None:
        raise SystemExit(f"{path or PLAN_JSON}: the plan is not frozen yet; freeze it after the pilot")
    verdicts = engine(runs, path)
    [c] = [c for c in verdicts["comparisons"] if c["arm"] == ARM]
    design = verdicts["plan"]
    judged_seeds = frozen["judged_seeds"]
    judged = {n: {r["seed"]: loss_for_comparison(r) for r in runs if r["norm"] == n and r["seed"] in judged_seeds
                  and _same(r["lr"], frozen["lrs"][n])} for n in NORMS}
    pairs = sorted(judged[ARM].keys() & judged[BASELINE].keys())
    diffs = {s: judged[ARM][s] - judged[BASELINE][s] for s in pairs}
    unigram = next((r["unigram_loss"] for r in runs if r.get("unigram_loss")), None)
    edge = {n: frozen["lrs"][n] in (LRS[0], LRS[-1]) for n in NORMS}
    untrained = [f"{n} seed {s}" for n in NORMS for s, v in judged[n].items() if unigram is None or v >= unigram]
    gate = pre.reported("both norms tuned and trained (a parity between untuned or untrained models says nothing)",
                        "each norm's pilot-chosen lr; judged runs below the unigram loss",
                        f"an lr inside the grid {LRS[0]:g}-{LRS[-1]:g}, every judged run below the unigram loss "
                        f"{fmt(unigram)}", {n: frozen["lrs"][n] for n in NORMS},
                        "absent" if any(edge.values()) or untrained else "present",
                        "the freeze stage of plan.json; the judged runs")
    word = pre.gate(c["verdict"], gate)
    pilot = pilot_table(runs)
    results = {
        "sweep": SWEEP, "plan_sha256": stage["plan_sha256"], "rules_version": stage["rules_version"],
        "freeze": {k: frozen[k] for k in ("frozen_at", "lrs", "loss_by_lr", "spread", "seeds_needed", "judged_seeds",
                                          "lr_margins", "warnings", "commands")},
        "pilot": pilot, "judged": judged, "diffs": diffs,
        "engine": {k: c.get(k) for k in ("diff", "ci_low", "ci_high", "ci_method", "p", "p_adjusted", "p_equivalent",
                                         "p_equivalent_adjusted", "n_pairs", "sd", "fail_arm", "fail_baseline",
                                         "verdict", "preregistered", "estimand", "as_expected", "expected",
                                         "seeds_needed")},
        "breaches": design["breaches"], "pilot_runs_left_out": len(design["pilot_runs"]),
        "precondition": [gate], "verdict": word, "machine": runs_machine(runs)}
    rows = [[f"{lr:g}", *(mean(pilot[n][f"{lr:g}"].values()) for n in NORMS),
             *(" / ".join(f"{v:.3f}" for _, v in sorted(pilot[n][f"{lr:g}"].items())) for n in NORMS)] for lr in LRS]
    spread = frozen["spread"][ARM]
    ci = "-" if c.get("ci_low") is None else f"[{c['ci_low']:+.4f}, {c['ci_high']:+.4f}]"
    md = (f"Machine: {runs_machine(runs)}. {len(runs)} runs of sweep `{SWEEP}` (pilot seeds "
          f"{PILOT_SEEDS[0]}-{PILOT_SEEDS[-1]}, judged seeds {', '.join(map(str, judged_seeds))}); plan sha256 "
          f"{stage['plan_sha256'][:12]}, rules version {stage['rules_version']}.\n\n"
          f"### Pilot: final val loss (failures at ln V)\n\n"
          f"{table(['lr', f'{BASELINE} (mean)', f'{ARM} (mean)', f'{BASELINE} per seed', f'{ARM} per seed'], rows)}"
          f"\n\n### Freeze ({frozen['frozen_at']})\n\n"
          f"lrs: {_lrs(frozen)}; pilot spread of {ARM} - {BASELINE}: sd "
          f"{fmt(spread['sd'], 4)} (upper {100 * spread['confidence']:.0f}% bound {fmt(spread['sd_upper'], 4)}, "
          f"{spread['pairs']} pairs); judged seeds needed: {frozen['seeds_needed']}."
          + "".join(f"\n\nWarning: {w}" for w in frozen["warnings"]) +
          f"\n\n{pre.line(gate)}\n\n### Judged runs: final val loss at the frozen lrs\n\n"
          + table(["seed", BASELINE, ARM, f"{ARM} - {BASELINE}"],
                  [[s, judged[BASELINE].get(s), judged[ARM].get(s), diffs.get(s)] for s in judged_seeds], 4) +
          f"\n\n### Verdict (the engine's, graded by the recorded plan)\n\n{ARM} - {BASELINE}: "
          f"{c['diff']:+.4f} nats, 95% CI {ci} over {c.get('n_pairs')} pairs (p of no difference "
          f"{fmt(c.get('p'), 3)}, of the equivalence test {fmt(c.get('p_equivalent'), 3)}): engine word "
          f"**{c['verdict']}** (expected {c.get('expected')}); pre-registered: {fmt(c.get('preregistered'))}; "
          f"breaches of the design: {len(design['breaches'])}; estimand: {c.get('estimand')}. Round verdict: "
          f"**{word}**.\n\nverdicts.md: the same comparison as `minillm-report logs/{SWEEP} --plan` writes it.\n")
    return results, md


def plot(runs: Runs, out: Path, path: Path | None = None) -> None:
    """Left: the pilot's final val loss against the lr, one line per seed, the frozen lr ringed. Right: the judged
    paired differences per seed, their mean and 95% interval, the margin shaded."""
    plt = pyplot()
    runs = _ours(runs)
    _, _, frozen = record(path)
    pilot = pilot_table(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, n in enumerate(NORMS):
        for k, s in enumerate(PILOT_SEEDS):
            pts = [(lr, pilot[n][f"{lr:g}"].get(s)) for lr in LRS if pilot[n][f"{lr:g}"].get(s) is not None]
            if pts:
                axes[0].plot(*zip(*pts, strict=True), marker="o", color=f"C{i}", alpha=0.6, ls=("-", "--", ":")[k % 3],
                             label=f"{n}, seed {s}")
        lr = frozen["lrs"][n]
        at = mean(pilot[n][f"{lr:g}"].values())
        if at is not None:
            axes[0].plot([lr], [at], "o", ms=14, mfc="none", color=f"C{i}")
    axes[0].set(xscale="log", xlabel="lr", ylabel="final val loss (failed: ln V)",
                title="pilot (seeds " + ", ".join(map(str, PILOT_SEEDS)) + "): frozen lr ringed")
    axes[0].legend(fontsize=7)
    verdicts = engine(runs, path)
    [c] = [c for c in verdicts["comparisons"] if c["arm"] == ARM]
    judged = {n: {r["seed"]: loss_for_comparison(r) for r in runs if r["norm"] == n
                  and r["seed"] in frozen["judged_seeds"] and _same(r["lr"], frozen["lrs"][n])} for n in NORMS}
    seeds = sorted(judged[ARM].keys() & judged[BASELINE].keys())
    axes[1].axhspan(-MARGIN, MARGIN, color="0.9", label=f"±{MARGIN:g} margin")
    axes[1].axhline(0, color="0.5", lw=0.8)
    axes[1].plot(seeds, [judged[ARM][s] - judged[BASELINE][s] for s in seeds], "o", color="C1", label="per seed")
    if c.get("ci_low") is not None:
        x = seeds[-1] + 1.5
        axes[1].errorbar([x], [c["diff"]], yerr=[[c["diff"] - c["ci_low"]], [c["ci_high"] - c["diff"]]], fmt="s",
                         color="k", capsize=4, label=f"mean, 95% CI: {c['verdict']}")
    axes[1].set_xticks([*seeds, seeds[-1] + 1.5], [*map(str, seeds), "mean"])
    axes[1].set(xlabel="judged seed", ylabel=f"{ARM} - {BASELINE} (nats)",
                title=f"judged seeds, frozen lrs ({_lrs(frozen)})")
    axes[1].legend(fontsize=7)
    save(fig, out / "two_stage.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda key: False, analyze, plot, argv, engine=engine)


if __name__ == "__main__":
    main()

