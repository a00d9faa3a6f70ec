"""S13 round 2 (pre-registered): how many steps does nGPT need to reach Pre-LN RMSNorm's 400-step loss, with its lr
chosen for each budget? Round 1 ran nGPT at 100, 200 and 400 steps at the one lr its 400-step pilot chose: the paper's
4x and 2x were not reached (nGPT after 200 steps +0.179 nats above the baseline after 400), and at 400 steps nGPT was
better (-0.042). Its 400-step run reached the baseline's loss at step 300-400 of a schedule that had not annealed
there, a speed-up of at least 1.0-1.3x, so how many steps nGPT needs was not measured. This round measures it as the
paper does: separate runs at budgets between 200 and 400 steps, each its own cosine schedule and its own lr, chosen
on pilot seeds disjoint from the judged ones. The rules below are committed before any run (this version amends the
first pre-registration, also before any run); the data commit cites this one.

Setting: round 1's (configs/experiment/s13_ngpt.yaml: dim 64, 4 layers, 4 heads, context 64, batch 16 x 64
characters of Shakespeare, AdamW, cosine schedule to 0.1x, ~0.23M parameters, validation every 50 steps). Baseline:
Pre-LN RMSNorm, warmup 40, weight decay 0.1, at STEPS steps. nGPT: model.ngpt=true, norm=none, no weight decay, no
warmup (its paper's training) at each of BUDGETS steps. The analysis checks each run's arm settings (ARMS).

Stage 1, the pilot (seeds PILOT_SEEDS): the baseline at STEPS steps over BASE_LRS; nGPT at each budget over NGPT_LRS
(round 1's pilot put the baseline's best between 3e-3 and 1e-2, 0.029 nats apart, about the PARITY margin, so the
grids step by 1.5-2x). Each cell's lr is the grid point of lower mean final val loss over the pilot seeds,
written to lr_choice.json (`--choose-lr SWEEP...`, which prints "baseline=<lr> 200=<lr> ... 400=<lr>" for run.sh).
run.sh stops before the judged runs when a chosen lr lies at its grid's edge: that cell's grid is then widened in a
new pre-registration commit, while the judged seeds are still unrun.
Stage 2, the judged runs (seeds SEEDS, disjoint from the pilot's, one run per cell and seed): the baseline at its
lr, nGPT at each budget at that budget's lr.

Every run enters as it ended (run_loss): a diverged or crashed run at ln V (minillm.outcome.loss_for_comparison), a
completed one at its final val loss; a run stopped by a signal, or short of its budget without diverging, stops the
analysis (run.sh again resumes one a signal stopped), as do duplicate runs of one cell, lr and seed, and pilot runs
at an lr off their cell's grid.

    bash experiments/studies/s13_ngpt/r2_steps_to_target/run.sh      # pilot, lr choice, judged runs, analysis

Compute: 72 pilot runs and 48 judged runs, 38,000 steps of 1,024 tokens in all; at round 1's ~14,000 tokens/s per
process for the baseline and ~9,000-11,000 for nGPT and ~10 s of start-up per run, two processes side by side:
~40 min.

Precondition (the gate, per part): both cells a part compares are tuned: the baseline's chosen lr and that of nGPT
at the part's budget each lie inside their grid, not at its edge. Absent: that part reads "premise absent at this
scale".
Hypotheses (8 judged seeds, paired by seed, final val loss; each part's 95% t interval of the seed mean):
  R-B, for B in 200, 250, 300, 350 (nGPT reaches the baseline's 400-step loss plus PARITY in B steps, a speed-up of
    400/B; R-200 is round 1's F2 with the lr chosen for the budget): nGPT after B steps - baseline after 400 at most
    +PARITY.
  F1 (round 1's, on fresh seeds, with the lr chosen again; read on its own): nGPT after 400 - baseline after 400 at
    most -BETTER.
  F1's word: "confirmed" when its interval lies at or below the threshold, "not at this scale" when it lies wholly
  above, "unresolved" when it crosses it.
  The R-B family by fixed-sequence testing, its order fixed now (sequence_words): going down from R-350, each part
  whose interval lies at or below +PARITY is "confirmed" while every larger budget was confirmed; going up from R-200,
  each part whose interval lies wholly above +PARITY is "not at this scale" while every smaller budget was; every
  other part is "unresolved" (also one whose own interval alone would have given a word). Each direction is tested
  at the one-sided 2.5% of a 95% interval, so the family's chance of any false word is at most 5% (nominal: the t
  interval of 8 seeds; a run at ln V widens it; test_rules.py simulates the hardest case, every gap
  at the margin); F1, a question of its own, adds at most 2.5%. A part whose premise
  is absent reads "premise absent at this scale" and ends its sequence.
The round's reading of the speed-up (from the R-B words, fixed now): at least 400/B for the smallest B whose R-B is
confirmed; below 400/B' for the largest B' whose R-B reads "not at this scale"; a missing end is said ("no budget
confirmed", "none excluded"); "premise absent at this scale" when every R-B part is. It reads the steps to the
baseline's 400-step loss plus PARITY, not to that loss itself.
Reported, not tested: the pilot's mean loss per lr at each budget; each part's gap per seed; verdicts.json, the
comparison engine's verdicts (rules version 4, its defaults) of each nGPT budget against the baseline.
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
from minillm.analysis.compare import compare
from minillm.analysis.runs import find_runs
from minillm.metrics import VAL_LOSS

HERE = Path(__file__).parent
LR_FILE = HERE / "lr_choice.json"
# --- fixed before the runs ---------------------------------------------------------------------------------
STEPS, BUDGETS = 400, (200, 250, 300, 350, 400)
BASE_LRS, NGPT_LRS = (1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2e-2), (5e-3, 1e-2, 2e-2, 3e-2, 5e-2, 1e-1)
PILOT_SEEDS, SEEDS = (0, 1), tuple(range(20, 28))
PARITY = 0.03  # nats: round 1's "the same loss"
BETTER = 0.01  # nats: round 1's "better" by at least this
TAG = "steps_to_target"
ARMS = {"baseline": {"norm": "rmsnorm", "warmup_steps": 40, "weight_decay": 0.1},
        "ngpt": {"norm": "none", "warmup_steps": 0, "weight_decay": 0.0}}
ENGINE_RULES = {"version": 4}  # the comparison engine's rules version when this round was pre-registered


def cell_of(run: dict) -> str:
    """"baseline" or the nGPT budget ("200" ... "400") of a run."""
    ngpt = ((run.get("settings") or {}).get("model") or {}).get("ngpt")
    return str(run["max_steps"]) if ngpt else "baseline"


CELLS = ("baseline", *map(str, BUDGETS))


def label(cell: str) -> str:
    return cell if cell == "baseline" else f"nGPT, {cell} steps"


def grid(cell: str) -> tuple[float, ...]:
    return BASE_LRS if cell == "baseline" else NGPT_LRS


run_loss = prereg.ended_loss  # a crashed run at ln V, a diverged one too, a completed one at its final val loss


def _checked(runs: Runs) -> Runs:
    """This round's runs (TAG), each one that ended (not stopped by a signal, its budget trained unless it diverged
    or crashed), in its arm's settings, at a cell and seed of this round, at most one per cell, lr and seed."""
    runs = Runs(r for r in runs if TAG in (r.get("tags") or []))
    name = prereg.run_name
    prereg.require_ended(runs)
    if off := [r for r in runs if cell_of(r) == "baseline" and r["max_steps"] != STEPS]:
        raise SystemExit(f"{len(off)} baseline run(s) not at {STEPS} steps")
    if other := sorted({cell_of(r) for r in runs} - set(CELLS)):
        raise SystemExit(f"nGPT runs at budgets this round does not have: {', '.join(other)} steps")
    for r in runs:
        arm = ARMS["baseline" if cell_of(r) == "baseline" else "ngpt"]
        if wrong := [f"{k} {r.get(k)!r} (its arm's: {v!r})" for k, v in arm.items() if r.get(k) != v]:
            raise SystemExit(f"{name(r)}: {', '.join(wrong)}")
    if off_grid := [name(r) for r in runs if r["seed"] in PILOT_SEEDS
                    and not any(math.isclose(r["lr"], lr) for lr in grid(cell_of(r)))]:
        raise SystemExit(f"pilot run(s) at an lr off their cell's grid: {', '.join(off_grid[:5])}")
    if seeds := sorted({r["seed"] for r in runs} - {*PILOT_SEEDS, *SEEDS}):
        raise SystemExit(f"runs at seeds this round does not have: {seeds}")
    prereg.require_once(runs, lambda r: (cell_of(r), round(math.log10(r["lr"]), 6), r["seed"]),
                        lambda k: f"{k[0]} lr {10 ** k[1]:g} seed {k[2]}")
    return runs


def choose_lr(runs: Runs) -> dict:
    """Each cell's lr from the pilot (PILOT_SEEDS): the grid point of lower mean loss (run_loss); a cell without
    every pilot run stops the choice."""
    runs, out = _checked(runs), {}
    for c in CELLS:
        means = {}
        for lr in grid(c):
            vals = [run_loss(r) for r in runs if cell_of(r) == c and r["seed"] in PILOT_SEEDS
                    and math.isclose(r["lr"], lr)]
            if len(vals) != len(PILOT_SEEDS):
                raise SystemExit(f"the pilot lacks {c} at lr {lr:g}: {len(vals)} of {len(PILOT_SEEDS)} seeds")
            means[lr] = mean(vals)
        best = min(means, key=means.__getitem__)
        out[c] = {"lr": best, "edge": best in (grid(c)[0], grid(c)[-1]),
                  "pilot": {f"{lr:g}": m for lr, m in means.items()}}
    return out


ABSENT = pre.PREMISE_ABSENT


def sequence_words(readings: dict[int, str | None]) -> dict[int, str]:
    """The R-B family's words by fixed-sequence testing (budget -> its interval's reading, "holds", "fails" or
    "unresolved"; None where the part's premise is absent): confirmed going down from the largest budget while each
    holds, not at this scale going up from the smallest while each fails, the rest unresolved. (A fixed-sequence
    procedure is one loop per direction; the statistics libraries minillm uses offer Holm and its kin, not this.)"""
    out = {b: ABSENT if r is None else "unresolved" for b, r in readings.items()}
    for order, reading, word in ((sorted(readings, reverse=True), "holds", "confirmed"),
                                 (sorted(readings), "fails", "not at this scale")):
        for b in order:
            if readings[b] != reading:
                break
            out[b] = word
    return out


def speed_up(words: dict[int, str]) -> str:
    """The round's reading of the speed-up from the R-B words (budget -> word)."""
    if all(w == ABSENT for w in words.values()):
        return ABSENT
    confirmed = [b for b, w in words.items() if w == "confirmed"]
    excluded = [b for b, w in words.items() if w == "not at this scale"]
    low = f"at least {STEPS / min(confirmed):.2f}x" if confirmed else "no budget confirmed"
    high = f"below {STEPS / max(excluded):.2f}x" if excluded else "none excluded"
    return f"{low}; {high}"


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = _checked(runs)
    chosen = choose_lr(runs)
    judged = Runs(r for r in runs if r["seed"] in SEEDS)
    prereg.require(judged, "the cell's chosen lr", lambda r: math.isclose(r["lr"], chosen[cell_of(r)]["lr"]))
    val = {c: prereg.by_seed([r for r in judged if cell_of(r) == c], run_loss) for c in CELLS}
    if missing := [f"{c} (seeds {sorted(set(SEEDS) - set(v))})" for c, v in val.items() if set(v) != set(SEEDS)]:
        raise SystemExit(f"judged runs missing: {'; '.join(missing)}")
    gates = {c: pre.reported(f"a tuned {label(c)}", f"the pilot's best lr ({len(PILOT_SEEDS)} seeds)",
                             f"inside the grid {grid(c)[0]:g}-{grid(c)[-1]:g}", {label(c): chosen[c]["lr"]},
                             "absent" if chosen[c]["edge"] else "present", "the pilot runs, this file's lr rule")
             for c in CELLS}
    base = val["baseline"]
    gaps = {b: prereg.diffs(val[str(b)], base) for b in BUDGETS}
    each = {f"R-{b}": pre.against(gaps[b], PARITY, "at most") for b in BUDGETS[:-1]}
    each["F1"] = pre.against(gaps[STEPS], -BETTER, "at most")
    tuned = {b: pre.gate("confirmed", gates["baseline"], gates[str(b)]) != ABSENT for b in BUDGETS}
    words = sequence_words({b: each[f"R-{b}"]["reading"] if tuned[b] else None for b in BUDGETS[:-1]})
    words = {f"R-{b}": w for b, w in words.items()}
    words["F1"] = pre.gate(prereg.word(each["F1"]), gates["baseline"], gates[str(STEPS)])
    text = lambda k: f"nGPT at {STEPS if k == 'F1' else k[2:]} steps - baseline at {STEPS}"  # noqa: E731
    verdicts = {k: (w, prereg.interval_line(k, each[k], text(k), w)) for k, w in words.items()}
    reading = speed_up({int(k[2:]): w for k, w in words.items() if k.startswith("R-")})
    lrs = sorted({*BASE_LRS, *NGPT_LRS})
    pilot = table(["cell", *(f"lr {lr:g}" for lr in lrs), "chosen"],
                  [[label(c), *(chosen[c]["pilot"].get(f"{lr:g}", "") for lr in lrs), f"{chosen[c]['lr']:g}"]
                   for c in CELLS])
    rows = [[label(c), f"{chosen[c]['lr']:g}", mean(val[c].values()),
             "" if c == "baseline" else mean(gaps[int(c)]),
             " / ".join(f"{v:.3f}" for _, v in sorted(val[c].items()))] for c in CELLS]
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"Machine: {runs_machine(runs)}, from {runs_commits(runs)}; pilot seeds "
          f"{PILOT_SEEDS[0]}-{PILOT_SEEDS[-1]}, judged seeds {SEEDS[0]}-{SEEDS[-1]}.\n\n"
          f"### Stage 1, the pilot: mean final val loss (failures at ln V)\n\n{pilot}\n\n"
          + "\n\n".join(pre.line(g) for g in gates.values())
          + f"\n\n### Stage 2, the judged runs: final val loss (failures at ln V)\n\n"
          f"{table(['cell', 'lr', 'val loss (mean)', 'minus the baseline (mean)', 'per seed'], rows)}\n\n"
          f"### Verdicts (rules fixed before the runs; R-B by fixed-sequence testing of the 95% intervals, F1 on its "
          f"own)\n\n{vt}\n\n"
          f"The speed-up to the baseline's {STEPS}-step loss + {PARITY:g}, read from the R-B words: **{reading}**.\n\n"
          f"verdicts.md: minillm.analysis.compare's verdicts, each nGPT budget against the baseline.\n")
    return {"lr_choice": chosen, "val": val, "verdicts": verdicts, "speed_up": reading,
            "precondition": list(gates.values()), "parts": each}, md


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare, each nGPT budget's judged runs against the baseline's."""
    judged = [{**r, "arm": cell_of(r) if cell_of(r) == "baseline" else f"ngpt@{cell_of(r)}"}
              for r in _checked(runs) if r["seed"] in SEEDS]
    return compare(judged, "arm", "baseline", **ENGINE_RULES)


def plot(runs: Runs, out: Path) -> None:
    """The pilot's loss against the lr per cell, and each budget's judged gap to the baseline with its interval."""
    plt = pyplot()
    chosen = choose_lr(runs)
    res, _ = analyze(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, c in enumerate(CELLS):
        pts = sorted((float(lr), m) for lr, m in chosen[c]["pilot"].items())
        axes[0].plot(*zip(*pts, strict=True), "o-", color=f"C{i}", alpha=0.8, label=label(c))
    axes[0].set(xscale="log", xlabel="lr", ylabel="pilot mean final val loss (failed: ln V)",
                title=f"pilot, seeds {PILOT_SEEDS[0]}-{PILOT_SEEDS[-1]}")
    axes[0].legend(fontsize=8)
    base = res["val"]["baseline"]
    for b in BUDGETS:
        gaps = prereg.diffs(res["val"][str(b)], base)
        axes[1].scatter([b] * len(gaps), gaps, color="C1", alpha=0.4, s=12)
        part = res["parts"]["F1" if b == STEPS else f"R-{b}"]
        axes[1].errorbar([b], [part["mean"]], yerr=[[part["mean"] - part["ci_low"]], [part["ci_high"] - part["mean"]]],
                         fmt="o", color="k", capsize=4)
    axes[1].axhline(PARITY, color="C3", ls="--", lw=1, label=f"+{PARITY:g} (the same loss)")
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].set(xlabel="nGPT's budget (steps)", ylabel=f"nGPT - baseline at {STEPS} steps (nats)",
                title=f"judged seeds {SEEDS[0]}-{SEEDS[-1]}: mean, 95% CI, each seed")
    axes[1].legend(fontsize=8)
    save(fig, out / "steps_to_target.png")


def write_lr_choice(sweeps: list[str]) -> None:
    """Each cell's pilot lr from the sweep folders, into lr_choice.json, and "baseline=<lr> 200=<lr> ... 400=<lr>" on
    stdout (what run.sh reads); a chosen lr at its grid's edge stops with one line after both are written."""
    chosen = choose_lr(Runs(run.summary for folder in sweeps for run in find_runs(folder)))
    LR_FILE.write_text(json.dumps(chosen, indent=1) + "\n")
    print(" ".join(f"{c}={chosen[c]['lr']:g}" for c in CELLS))
    if edges := [f"{label(c)} {chosen[c]['lr']:g}" for c in CELLS if chosen[c]["edge"]]:
        raise SystemExit(f"the pilot's lr lies at its grid's edge for {', '.join(edges)} ({LR_FILE.name}): "
                         "widen that grid in a new pre-registration commit before any judged run")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == VAL_LOSS, analyze, plot, argv, engine=engine,
                  stages={"--choose-lr": ("the pilot's sweep folders: each cell's lr into lr_choice.json, and "
                                          "'baseline=<lr> 200=<lr> ... 400=<lr>' on stdout (run.sh's stage 2 reads "
                                          "it); a chosen lr at its grid's edge stops it", write_lr_choice)})


if __name__ == "__main__":
    main()
