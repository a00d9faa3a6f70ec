"""S7 round 7 (pre-registered): does each identity-start residual scalar match DeepNorm at L = 48 when every arm runs
at its own lr, chosen on pilot seeds and judged on disjoint seeds? Round 6 found ReZero and LayerScale +0.065 and
+0.060 nats above DeepNorm at S7's lr 3e-3 and 900 steps (not at this scale, against a 0.02-nat margin). At lr 1e-2,
where DeepNorm failed 5 of 10 runs and Post-LN all 10, each scalar trained every run and ended within 0.02 nats of
DeepNorm at 3e-3; that reading paired the lrs after seeing the data and decides nothing. This round fixes each arm's
lr by a rule on pilot runs and judges the arms on other seeds. The rules below are committed before any run; the data
commit cites this one.

Setting: round 6's. configs/experiment/s7_depth.yaml at L = DEPTH (LayerNorm, dim 64, 4 heads, warmup 40, no
clipping, GPT-2's init; 2.6M parameters) at STEPS steps, compiled, the stability metrics every 50 steps, tag TAG.
Arms (ARMS, checked on every run): post+rezero and post+layerscale (placement=post, model.branch_scale with its
default inits: ReZero 0, LayerScale 1e-6 at this depth) and deepnorm (placement=deepnorm, no scalar), the reference.
Post-LN without a scalar is not an arm: round 6 saw it fail in all 10 runs at lr 1e-2, and no part compares with it.

Stage 1, the pilot (seeds PILOT_SEEDS): every arm at every lr of LRS (factor 2, one grid for every arm: round 6's lr
3e-3 on it, its 1e-2 between 6e-3 and 1.2e-2, and room up to 4.8e-2, as the scalars ended lower at 1e-2 than at 3e-3):
36 runs. Each arm's lr is, among its eligible lrs, the one of lowest mean outcome (below) over the pilot seeds, ties
to the lower lr. An lr is eligible when no pilot run of the arm failed at it or at the next lr up: the lowest mean
over two seeds sits at the edge of stability, where a run that trained in the pilot may fail in the judged seeds
(round 6's DeepNorm failed 5 of 10 runs at 1e-2, after first training), so the choice keeps one grid step below any
failure. A failed or stalled run also enters its lr's mean at ln V (a stalled run's final val loss sits near the
unigram loss, below ln V, where prereg.ended_loss alone would take it as it ended). An arm with no eligible lr gets
the grid's lowest, an edge. The choice is written to choice.json (`--choose SWEEP...`; `--print-sweeps judged` then
prints the judged sweeps). run.sh stops with one line before any judged run when a chosen lr lies at its grid's edge
(the lowest or highest of LRS); the grid is then widened in a new pre-registration commit while the judged seeds are
unrun.
Stage 2, the judged runs (seeds SEEDS, disjoint from the pilot's and from rounds 1-6's seeds 0-39): each arm at its
chosen lr, one run per arm and seed: 24 runs, paired by seed (a seed fixes the data order of every arm).

    bash experiments/studies/s7_depth/r7_own_lr/run.sh pilot     # 36 runs, then each arm's lr (choice.json)
    bash experiments/studies/s7_depth/r7_own_lr/run.sh judged    # 24 runs at the chosen lrs, then the analysis

Compute estimate, from round 6's runs (8.5 min a run of 900 steps on average, 6.2-15.8, two compiled processes of one
thread side by side on the 2-core VM): ~2.6 h for the pilot, ~1.7 h for the judged runs, ~4.3 h in all (runs that trip
the divergence guard end early). Each stage runs on its own, from the same commit. Each run has its own folder, named
by its lr and seed, and a checkpoint when a signal stops it, so the same command again resumes the stage.

The pilot's outcome, per run (``outcome``): a failed run at ln V (its loss_init, the loss of a uniform prediction, as
minillm.outcome.loss_for_comparison counts a diverged run; a failed run without it stops the choice), otherwise its
final val loss. "Failed" is round 6's rule: diverged, crashed, not trained, or stalled (final val loss within
STALL_MARGIN nats of the unigram loss or above it: S7's rule, minillm.outcome.is_stalled). The judged runs are read as
rounds 5 and 6 read them: the parts compare the final val loss on the seed pairs where both arms trained, and each
arm's failures are counted and gated apart (a single failure at ln V would make a paired gap of about 2.7 nats, below
zero when DeepNorm failed and above when the scalar did, and with it an interval about a nat wide on 8 seeds). Every
run is required: a missing run, one that has not ended (stopped by a signal, or short of its budget without diverging;
run.sh again resumes it), duplicate runs of one arm, lr and seed, pilot runs off the grid, judged runs off their arm's
chosen lr, runs at other seeds and runs not in their arm's settings (SETTINGS, placement and scalar) stop the analysis
with one line.

Premises (each part's; an absent one makes the part "premise absent at this scale"):
  tuned: both arms the part compares have their chosen lr inside the grid, not at its edge (run.sh stops before
    such judged runs; the analysis reads the premise all the same).
  the reference trains: DeepNorm at its chosen lr fails in at most SUFFICES of its 8 judged runs (round 4's rule of
    at most 1 of 10, here 1 of 8). Absent: both parts.
Hypotheses (the judged seeds where both arms trained, paired by seed, the final val loss). A scalar arm that fails
in more than SUFFICES of its 8 judged runs does not match a reference that trains: its part reads "not at this
scale", whatever the loss says. Otherwise (at least 6 pairs, as each arm fails at most once) each part's word comes
from its own two-sided 1 - ALPHA / 2 t interval (97.5%), Bonferroni over the two: "confirmed" when the interval lies
at or below +MARGIN, "not at this scale" when wholly above it, "unresolved" when it crosses it. With both gaps at the
margin the family gives any word from an interval with a chance of at most ALPHA; a false word, which only one side
can give for a true gap, at most ALPHA / 2:
  O-rezero (Bachlechner et al. 2021, ReZero, against Wang et al. 2022, DeepNorm): post+rezero - deepnorm at most
    +MARGIN.
  O-layerscale (Touvron et al. 2021, LayerScale, against DeepNorm): post+layerscale - deepnorm at most +MARGIN.
Reported beside the words, deciding nothing more: the pilot's mean outcome per arm and lr and its eligible lrs; each
arm's pilot failures per lr and judged failures, with their Clopper-Pearson intervals (8 runs an arm cannot tell
failure rates apart; round 5 tested the scalars' failures against Post-LN's); each arm's final val loss per judged
seed; round 6's numbers (its committed
results.json: seeds 30-39, lrs 3e-3 and 1e-2) beside them, for context (other seeds, not a paired comparison).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.machine import runs_commits, runs_machine
from experiments.common.plots import paired_differences, pyplot, save, seed_lines
from experiments.common.study import Runs, analysis_main, mean, rate_ci, table
from experiments.studies.s7_depth.r5_residual_scalars.analyze import STALL_MARGIN, SUFFICES, scalar_of
from experiments.studies.s7_depth.r6_scalars_budget import analyze as r6
from minillm.analysis.runs import find_runs
from minillm.metrics import VAL_LOSS

HERE = Path(__file__).parent
CHOICE = HERE / "choice.json"
ROUND6 = HERE.parent / "r6_scalars_budget" / "results.json"
# --- fixed before the runs ---------------------------------------------------------------------------------
DEPTH, STEPS, MARGIN = r6.DEPTH, r6.STEPS, r6.MARGIN  # round 6's setting; the project's equivalence margin (nats)
LRS = (1.5e-3, 3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2)
PILOT_SEEDS, SEEDS = (40, 41), tuple(range(50, 58))
ALPHA = 0.05  # the family's chance of any word with both gaps at the margin
TAG = "own_lr"
REFERENCE = "deepnorm"
ARMS = {"post+rezero": ["placement=post", "model.branch_scale=rezero"],
        "post+layerscale": ["placement=post", "model.branch_scale=layerscale"],
        REFERENCE: ["placement=deepnorm"]}  # arm -> its train.py overrides
PARTS = {"O-rezero": "post+rezero", "O-layerscale": "post+layerscale"}  # part -> its scalar arm, against REFERENCE
SETTINGS = {"norm": "layernorm", "n_layers": DEPTH, "max_steps": STEPS, "warmup_steps": 40, "grad_clip": None,
            "branch_scale_init": None}


def arm_of(run: dict) -> str | None:
    """Round 6's arm of the run when it is one of this round's (plain Post-LN is not)."""
    arm = r6.arm_of(run)
    return arm if arm in ARMS else None


def outcome(run: dict) -> float:
    """What the pilot's choice reads: ln V (loss_init) for a failed run (round 6's rule: diverged, crashed, not
    trained or stalled), otherwise prereg.ended_loss (the final val loss)."""
    if not r6.failed(run):
        return prereg.ended_loss(run)
    if run.get("loss_init") is None:
        raise SystemExit(f"{prereg.run_name(run)}: failed, and its summary has no loss_init (ln V) to count it at")
    return run["loss_init"]


def _checked(runs: Runs) -> Runs:
    """This round's runs (TAG), each one that ended, in its arm's settings, at a grid lr (pilot) and seed of this
    round, at most one per arm, lr and seed."""
    runs = Runs(r for r in runs if TAG in (r.get("tags") or []))
    prereg.require_ended(runs)
    for r in runs:
        got = {k: r.get(k) for k in SETTINGS}
        got["branch_scale_init"] = ((r.get("settings") or {}).get("model") or {}).get("branch_scale_init")
        if arm_of(r) is None or (wrong := [f"{k} {got[k]!r} (the round's: {v!r})" for k, v in SETTINGS.items()
                                           if got[k] != v]):
            why = "no arm of this round" if arm_of(r) is None else ", ".join(wrong)
            raise SystemExit(f"{prereg.run_name(r)}: {why} (placement {r.get('placement')!r}, branch_scale "
                             f"{scalar_of(r)!r})")
    if off := [prereg.run_name(r) for r in runs if r["seed"] in PILOT_SEEDS
               and not any(math.isclose(r["lr"], lr) for lr in LRS)]:
        raise SystemExit(f"pilot run(s) off the lr grid: {', '.join(off[:5])}")
    if seeds := sorted({r["seed"] for r in runs} - {*PILOT_SEEDS, *SEEDS}):
        raise SystemExit(f"runs at seeds this round does not have: {seeds}")
    prereg.require_once(runs, lambda r: (arm_of(r), round(math.log10(r["lr"]), 6), r["seed"]),
                        lambda k: f"{k[0]} lr {10 ** k[1]:g} seed {k[2]}")
    return runs


def choose(runs: Runs) -> dict:
    """Each arm's lr from the pilot (PILOT_SEEDS): among the eligible lrs (no failed pilot run at the lr or the next
    one up) the one of lowest mean outcome (a failed or stalled run at ln V; ties to the lower lr), the grid's lowest
    when none is eligible; with "edge" when it is the grid's lowest or highest, the pilot's means, failures and
    eligible lrs. An arm without every pilot run stops the choice."""
    runs, out = _checked(runs), {}
    for a in ARMS:
        cells = {lr: [r for r in runs if arm_of(r) == a and r["seed"] in PILOT_SEEDS and math.isclose(r["lr"], lr)]
                 for lr in LRS}
        if short := [f"lr {lr:g} ({len(rs)} of {len(PILOT_SEEDS)} seeds)" for lr, rs in cells.items()
                     if len(rs) != len(PILOT_SEEDS)]:
            raise SystemExit(f"the pilot lacks {a} at {', '.join(short)}")
        means = {lr: mean(map(outcome, rs)) for lr, rs in cells.items()}
        failed = {lr: sum(map(r6.failed, rs)) for lr, rs in cells.items()}
        eligible = [lr for i, lr in enumerate(LRS) if not failed[lr] and not (i + 1 < len(LRS) and failed[LRS[i + 1]])]
        best = min(eligible, key=means.__getitem__) if eligible else LRS[0]
        out[a] = {"lr": best, "edge": best in (LRS[0], LRS[-1]), "pilot": {f"{lr:g}": m for lr, m in means.items()},
                  "failed": {f"{lr:g}": [failed[lr], len(rs)] for lr, rs in cells.items()},
                  "eligible": [f"{lr:g}" for lr in eligible]}
    return out


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = _checked(runs)
    chosen = choose(runs)
    judged = Runs(r for r in runs if r["seed"] in SEEDS)
    prereg.require(judged, "the arm's chosen lr", lambda r: math.isclose(r["lr"], chosen[arm_of(r)]["lr"]))
    seeds = {a: {r["seed"] for r in judged if arm_of(r) == a} for a in ARMS}
    if missing := [f"{a} (seeds {sorted(set(SEEDS) - s)})" for a, s in seeds.items() if s != set(SEEDS)]:
        raise SystemExit(f"judged runs missing: {'; '.join(missing)}")
    val = {a: prereg.by_seed([r for r in judged if arm_of(r) == a and not r6.failed(r)], prereg.ended_loss)
           for a in ARMS}
    failures = {a: sum(r6.failed(r) for r in judged if arm_of(r) == a) for a in ARMS}
    tuned = {a: pre.reported(f"a tuned {a}", f"the pilot's best lr ({len(PILOT_SEEDS)} seeds)", "inside the lr grid",
                             {a: f"lr {chosen[a]['lr']:g}"}, "absent" if chosen[a]["edge"] else "present",
                             "the pilot runs, this file's rule") for a in ARMS}
    k = failures[REFERENCE]
    trains = pre.reported("DeepNorm, the reference, trains at its chosen lr",
                          f"failed runs (diverged, crashed, not trained or stalled) of {len(SEEDS)} judged",
                          f"at most {SUFFICES}", {f"lr {chosen[REFERENCE]['lr']:g}": f"{k}/{len(SEEDS)}"},
                          "present" if k <= SUFFICES else "absent", "this round's judged runs")
    level = f"{100 * (1 - ALPHA / len(PARTS)):g}%"
    parts, verdicts = {}, {}
    for name, arm in PARTS.items():
        gaps = prereg.diffs(val[arm], val[REFERENCE])
        parts[name] = pre.against(gaps, MARGIN, "at most", ALPHA / len(PARTS))
        text = f"{arm} - {REFERENCE} (the {len(gaps)} seed pairs where both trained)"
        if failures[arm] > SUFFICES:
            w = pre.gate("not at this scale", tuned[arm], tuned[REFERENCE], trains)
            verdicts[name] = (w, f"{name}: {arm} failed in {failures[arm]} of its {len(SEEDS)} judged runs (more than "
                                 f"{SUFFICES}), DeepNorm in {failures[REFERENCE]}")
        else:
            w = pre.gate(prereg.word(parts[name]), tuned[arm], tuned[REFERENCE], trains)
            verdicts[name] = (w, prereg.interval_line(name, parts[name], text, w, level))
    lr_head = [f"lr {lr:g}" for lr in LRS]
    pilot = table(["arm", *lr_head, "eligible", "chosen"],
                  [[a, *(chosen[a]["pilot"][f"{lr:g}"] for lr in LRS), ", ".join(chosen[a]["eligible"]) or "none",
                    f"{chosen[a]['lr']:g}"] for a in ARMS])
    pilot_failed = table(["arm", *lr_head], [[a, *(rate_ci(*chosen[a]["failed"][f"{lr:g}"]) for lr in LRS)]
                                             for a in ARMS])
    rows = [[a, f"{chosen[a]['lr']:g}", rate_ci(failures[a], len(SEEDS)), mean(val[a].values()),
             " / ".join(f"{val[a][s]:.3f}" if s in val[a] else "failed" for s in SEEDS)] for a in ARMS]
    judged_tab = table(["arm", "lr", "failed (95% CI)", "final val loss of the runs that trained (mean)",
                        "per seed"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"Machine: {runs_machine(runs)}, from {runs_commits(runs)}; L = {DEPTH}, LayerNorm, {STEPS} steps, pilot "
          f"seeds {PILOT_SEEDS[0]}-{PILOT_SEEDS[-1]}, judged seeds {SEEDS[0]}-{SEEDS[-1]}. A failed run (diverged, "
          f"crashed, not trained, or stalled within {STALL_MARGIN:g} nats of the unigram loss) counts at ln V in the "
          "pilot's means; an lr is eligible when no pilot run failed at it or at the next lr up.\n\n"
          f"### Stage 1, the pilot: mean outcome per lr\n\n{pilot}\n\nFailed runs (95% CI):\n\n"
          f"{pilot_failed}\n\n" + "\n\n".join(pre.line(g) for g in tuned.values())
          + f"\n\n### Stage 2, the judged runs\n\n{judged_tab}\n\n{pre.line(trains)}\n\n"
          f"### Verdicts (rules fixed before the runs; each part on its own {level} interval)\n\n{vt}\n\n"
          f"### Round 6, for context (seeds 30-39, other seeds: not a paired comparison)\n\n{round6()}\n")
    return {"choice": chosen, "val": val, "failed": failures, "verdicts": verdicts, "parts": parts,
            "precondition": [*tuned.values(), trains]}, md


def round6() -> str:
    """Round 6's committed numbers of this round's arms at its two lrs: failures and the runs that trained."""
    res = json.loads(ROUND6.read_text())
    rows = [[a, f"{lr:g}", rate_ci(*res["failed"][f"{a}@{lr:g}"]), mean(res["trained_loss"][f"{a}@{lr:g}"].values())]
            for lr in r6.LRS for a in ARMS]
    return table(["arm", "lr", "failed (95% CI)", "final val loss of the runs that trained (mean)"], rows)


def plot(runs: Runs, out: Path) -> None:
    """own_lr.png: the pilot's mean outcome per lr and arm; each judged seed's final val loss per arm at its chosen lr
    among the runs that trained (the failed counted in the title); the per-seed differences the parts read, with the
    margin."""
    res, _ = analyze(runs)
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for i, a in enumerate(ARMS):
        c = res["choice"][a]
        axes[0].plot(LRS, [c["pilot"][f"{lr:g}"] for lr in LRS], "o-", color=f"C{i}", label=f"{a} (chosen {c['lr']:g})")
    axes[0].set(xscale="log", xlabel="lr", ylabel="pilot mean outcome (failed: ln V)",
                title=f"pilot, seeds {PILOT_SEEDS[0]}-{PILOT_SEEDS[-1]}")
    axes[0].legend(fontsize=7)
    value: dict[int, dict[str, float]] = {}
    for a in ARMS:
        for seed, v in res["val"][a].items():
            value.setdefault(seed, {})[a] = v
    failed = ", ".join(f"{a} {res['failed'][a]}/{len(SEEDS)}" for a in ARMS)
    seed_lines(axes[1], value, list(ARMS), "final val loss (runs that trained)",
               f"judged seeds {SEEDS[0]}-{SEEDS[-1]}, each arm at its lr; failed: {failed}")
    axes[1].title.set_fontsize(8)
    paired_differences(axes[2], value, [(arm, REFERENCE, MARGIN, name) for name, arm in PARTS.items()])
    fig.suptitle(f"L = {DEPTH}, {STEPS} steps: each scalar and DeepNorm at its own lr", fontsize=10)
    save(fig, out / "own_lr.png")


def sweeps(stage: Sequence[str]) -> None:
    """run.sh's sweeps of a stage, one per line: its folder, then its overrides. "pilot": each arm over LRS at the
    pilot seeds; "judged": each arm at its chosen lr (choice.json, none at its grid's edge) at the judged seeds."""
    if list(stage) not in (["pilot"], ["judged"]):
        raise SystemExit(f"--print-sweeps {' '.join(stage)}: allowed: pilot, judged")
    chosen = None
    if stage[0] == "judged":
        if not CHOICE.exists():
            raise SystemExit(f"no {CHOICE.name} yet: the pilot's --choose writes it")
        chosen = json.loads(CHOICE.read_text())
        if edges := [a for a, c in chosen.items() if c["edge"]]:
            raise SystemExit(f"{CHOICE.name}: the lr of {', '.join(edges)} lies at its grid's edge: no judged run")
    for a, overrides in ARMS.items():
        lrs, seeds = (LRS, PILOT_SEEDS) if chosen is None else ((chosen[a]["lr"],), SEEDS)
        print(f"{stage[0]}_{a.replace('+', '_')}", *overrides, "optimizer.lr=" + ",".join(f"{lr:g}" for lr in lrs),
              "seed=" + ",".join(map(str, seeds)))


def write_choice(folders: list[str]) -> None:
    """Each arm's lr from the pilot's sweep folders, into choice.json, and "arm=lr ..." on stdout; a chosen lr at its
    grid's edge stops with one line after it is written."""
    chosen = choose(Runs({**run.summary, "curves": {}} for folder in folders for run in find_runs(folder)))
    CHOICE.write_text(json.dumps(chosen, indent=1) + "\n")
    print(" ".join(f"{a}={c['lr']:g}" for a, c in chosen.items()))
    if edges := [f"{a} {c['lr']:g}" for a, c in chosen.items() if c["edge"]]:
        raise SystemExit(f"the pilot's lr lies at its grid's edge for {', '.join(edges)} ({CHOICE.name}): "
                         "widen the grid in a new pre-registration commit before any judged run")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == VAL_LOSS, analyze, plot, argv,
                  stages={"--choose": ("the pilot's sweep folders: each arm's lr into choice.json; a chosen lr at "
                                       "its grid's edge stops it", write_choice),
                          "--print-sweeps": ("pilot or judged: that stage's sweeps for run.sh, one per line (folder, "
                                             "then overrides; judged reads choice.json)", sweeps)})


if __name__ == "__main__":
    main()
