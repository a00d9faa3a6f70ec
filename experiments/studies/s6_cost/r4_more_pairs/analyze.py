"""S6 round 4 (pre-registered): round 3's comparison with the seeds its report asked for. Is RMSNorm as
good as LayerNorm in the CPU study's model, both at lr 3e-3 (the lr round 3's 3-seed pilot chose for each norm),
over 31 fresh seed pairs? Round 3 (two stages) was inconclusive over the 3 judged pairs its pilot's spread planned,
+0.0112 nats, 95% CI [-0.0323, +0.0547], and the engine asked about 31 pairs at the judged spread (sd 0.0175). The
rules below are committed before any run; the data commit cites this one.

Claim (Zhang & Sennrich 2019): RMSNorm reaches quality comparable to LayerNorm's. Expected: equivalent.

Setting: round 3's (`experiment=cpu_study threads=1`: dim 64, 4 layers, 4 heads, context 64, batch 16, 400 steps,
~0.22M parameters, 1.8 tokens per parameter), Pre-LN, sweep `name=s6_r4_rms_vs_ln`, the final val loss.

Rules (plan.yaml beside this file, recorded as plan.json by minillm-plan before the runs; minillm's rules version 3
as they stand at the pre-registration commit): design single-stage at the fixed lr 3e-3 for both norms (chosen by
round 3's pilot on seeds 0-2, disjoint from these: no lr is chosen on the judged runs), seeds 200-230 (31 pairs, all
run), paired by seed, margin 0.02 nats (round 3's), alpha 0.05, failed runs penalized, TOST. The verdict is the
engine's word for rmsnorm as `minillm-report logs/s6_r4_rms_vs_ln --plan` grades it (minillm.analysis.plans.grade,
minillm.analysis.compare.compare, minillm.analysis.plans.apply); its estimand: each norm at lr 3e-3.

Precondition (the gate, read first): both norms train: every run ends below the unigram loss. Absent: the word reads
"premise absent at this scale" and the engine's word stands beside it as an observation.

    bash experiments/studies/s6_cost/r4_more_pairs/run.sh       # plan, the 62 runs, report, analysis

Compute: 62 runs of 400 steps, 20-40 s each on one thread of the shared 2-core VM, one at a time (~25 min).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, analysis_main, fmt, table
from minillm.analysis import plan_record, plans
from minillm.analysis.compare import compare
from minillm.analysis.rules import Rules
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
PLAN_JSON = HERE / "plan.json"  # the record minillm-plan wrote (logs/SWEEP/plan.json), committed with the data
PLAN_YAML = HERE / "plan.yaml"
# --- fixed before the runs (the same as plan.yaml; test_rules.py checks they agree) ----------------------------
SWEEP = "s6_r4_rms_vs_ln"
BASELINE, ARM = "layernorm", "rmsnorm"
NORMS = (BASELINE, ARM)
LR = 3e-3
SEEDS = tuple(range(200, 231))
MARGIN = 0.02  # nats


def _ours(runs: Runs) -> Runs:
    return Runs(r for r in runs if r.get("name") == SWEEP and r.get("norm") in NORMS)


def engine(runs: Runs, path: Path | None = None) -> dict:
    """The verdict as `minillm-report --plan` gives it: the recorded plan's rules on its seeds' runs."""
    path = path or PLAN_JSON
    record = plans.read_record(path)
    records = [{k: v for k, v in r.items() if k != "curves"} for r in runs]
    try:
        shown = path.resolve().relative_to(HERE.parents[3])  # named from the repository root in verdicts.json
    except ValueError:
        shown = path
    rules, kept, check, info = plans.grade(record, records, shown)
    committed = plan_record.sha256(PLAN_YAML.read_bytes())  # the plan file beside this one, not the recorded path
    info.update(plan_file=str(shown.parent / PLAN_YAML.name), plan_file_changed=committed != info["plan_hash"])
    return plans.apply(compare(kept, rules=Rules(**rules), run_check=check), info)


def losses(runs: Runs) -> dict[str, dict[int, float]]:
    """norm -> seed -> final val loss (a failed run at ln V) at LR."""
    return {n: {r["seed"]: loss_for_comparison(r) for r in runs if r["norm"] == n and r["seed"] in SEEDS
                and math.isclose(r["lr"], LR)} for n in NORMS}


def analyze(runs: Runs, path: Path | None = None) -> tuple[dict, str]:
    runs = _ours(runs)
    stage, _ = plan_record.current(plans.read_record(path or PLAN_JSON))
    verdicts = engine(runs, path)
    [c] = [c for c in verdicts["comparisons"] if c["arm"] == ARM]
    loss = losses(runs)
    pairs = sorted(loss[ARM].keys() & loss[BASELINE].keys())
    diffs = {s: loss[ARM][s] - loss[BASELINE][s] for s in pairs}
    unigram = next((r["unigram_loss"] for r in runs if r.get("unigram_loss")), None)
    untrained = {n: sum(1 for v in loss[n].values() if unigram is None or v >= unigram) for n in NORMS}
    gate = pre.reported("both norms train (a parity between untrained models says nothing)",
                        "runs at or above the unigram loss", f"none (the unigram loss {fmt(unigram)})", untrained,
                        "absent" if any(untrained.values()) else "present", "this round's runs")
    word = pre.gate(c["verdict"], gate)
    plan = verdicts["plan"]
    results = {
        "sweep": SWEEP, "plan_sha256": stage["plan_sha256"], "rules_version": stage["rules_version"], "lr": LR,
        "losses": loss, "diffs": diffs,
        "engine": {k: c.get(k) for k in ("diff", "ci_low", "ci_high", "ci_method", "p", "p_adjusted", "p_equivalent",
                                         "p_equivalent_adjusted", "n_pairs", "sd", "fail_arm", "fail_baseline",
                                         "verdict", "exploratory", "as_expected", "expected", "seeds_needed")},
        "runs_before_plan": len(plan["runs_before_plan"]), "unplanned_runs": len(plan["unplanned_runs"]),
        "precondition": [gate], "verdict": word, "machine": runs_machine(runs)}
    ci = "-" if c.get("ci_low") is None else f"[{c['ci_low']:+.4f}, {c['ci_high']:+.4f}]"
    md = (f"Machine: {runs_machine(runs)}. {len(runs)} runs of sweep `{SWEEP}` (seeds {SEEDS[0]}-{SEEDS[-1]}, both "
          f"norms at lr {LR:g}); plan sha256 {stage['plan_sha256'][:12]}, rules version {stage['rules_version']}; "
          f"runs started before the plan: {len(plan['runs_before_plan'])}.\n\n{pre.line(gate)}\n\n"
          "### Final val loss per seed\n\n"
          + table(["seed", BASELINE, ARM, f"{ARM} - {BASELINE}"],
                  [[s, loss[BASELINE].get(s), loss[ARM].get(s), diffs.get(s)] for s in SEEDS], 4) +
          f"\n\n### Verdict (the engine's, graded by the recorded plan)\n\n{ARM} - {BASELINE}: "
          f"{fmt(c.get('diff'), 4)} nats, 95% CI {ci} over {c.get('n_pairs')} pairs (sd {fmt(c.get('sd'), 4)}; p of "
          f"no difference {fmt(c.get('p'), 3)}, of the equivalence test {fmt(c.get('p_equivalent'), 3)}): engine word "
          f"**{c['verdict']}** (expected {c.get('expected')}). Round verdict: **{word}**.\n\n"
          f"verdicts.md: the same comparison as `minillm-report logs/{SWEEP} --plan` writes it.\n")
    return results, md


def plot(runs: Runs, out: Path, path: Path | None = None) -> None:
    """The paired differences per seed, their mean and 95% interval, the margin shaded."""
    plt = pyplot()
    runs = _ours(runs)
    loss = losses(runs)
    [c] = [c for c in engine(runs, path)["comparisons"] if c["arm"] == ARM]
    seeds = sorted(loss[ARM].keys() & loss[BASELINE].keys())
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.axhspan(-MARGIN, MARGIN, color="0.9", label=f"±{MARGIN:g} margin")
    ax.axhline(0, color="0.5", lw=0.8)
    ax.plot(seeds, [loss[ARM][s] - loss[BASELINE][s] for s in seeds], "o", color="C1", label="per seed")
    if c.get("ci_low") is not None:
        x = seeds[-1] + 2
        ax.errorbar([x], [c["diff"]], yerr=[[c["diff"] - c["ci_low"]], [c["ci_high"] - c["diff"]]], fmt="s",
                    color="k", capsize=4, label=f"mean, 95% CI: {c['verdict']}")
    ax.set(xlabel="seed (the square: the mean)", ylabel=f"{ARM} - {BASELINE} (nats)",
           title=f"both at lr {LR:g}, {len(seeds)} seed pairs")
    ax.legend(fontsize=7)
    save(fig, out / "pairs.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda key: False, analyze, plot, argv, engine=engine)


if __name__ == "__main__":
    main()
