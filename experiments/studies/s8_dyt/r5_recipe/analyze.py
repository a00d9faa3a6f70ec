"""S8 round 5 (pre-registered): DyT and Derf in their language-model recipe, each at its own lr and alpha0 chosen on
pilot seeds, against RMSNorm at its own lr. Round 4 put Derf +0.097 [+0.064, +0.130] nats behind RMSNorm and read
the embedding scale sqrt(C) as widening the gap, but it scaled unit-scale (xavier) embeddings, which no recipe does,
and ran every arm at one lr and one alpha0. This round runs the recipes' init: GPT-2's N(0, 0.02) embeddings times
the learnable scalar sqrt(C), an RMS of 0.16 at init at C = 64 (at LLaMA 7B's width the same recipe gives
0.02 x sqrt(4096) = 1.28, so the scaled arms' alpha0 grid reaches 8 to cover what |alpha x| is there), each arm
tuned by a two-seed pilot over lr x alpha0 and judged on eight fresh seeds. The premise is read during training,
not at init: under GPT-2's init DyT's inputs can start in tanh's linear range (round 1: none saturated), so what
decides whether DyT acted as a squashing norm is the share of its inputs in tanh's bend late in training.
The rules below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s8_dyt.yaml (Pre-LN, dim 64, 4 layers, 4 heads, ~0.225M parameters, batch 16 x 64
characters, AdamW, warmup 40 + cosine, no clipping), model.init=gpt2, STEPS steps (410k tokens, 1.8 tokens per
parameter), the stability callbacks with the probe every 25 steps (norm/<site>/saturation). One alpha0 for every
site (the papers tune the one before attention apart). Arms (ARMS, checked on every run): RMSNorm; DyT without the
embedding scale; DyT and Derf with model.embed_scale=true.

Stage 1, the pilot (seeds PILOT_SEEDS): RMSNorm over LRS, each point-wise arm over its LRS_OF x ALPHA0S (the unscaled
DyT's around round 2's best, 0.1: its inputs start at RMS 0.02, where every alpha0 of 0.5 and more left rounds 1-2 at
the unigram loss; the scaled arms' around the alpha0 that puts |alpha x| where the recipes have it). Each arm's cell is
the grid point of lower mean loss (prereg.ended_loss) over the pilot seeds, written to choice.json (`--choose
SWEEP...`; `--print-sweeps judged` then prints the judged sweeps for run.sh). run.sh stops before any judged run when a
chosen lr or alpha0 lies at its grid's edge: that grid is widened in a new pre-registration commit while the judged
seeds are unrun.
Widened after the pilot, before any judged run (the amendment commit; the rule above, applied): the pilot chose DyT's
lr at its grid's top (3e-2 with alpha0 0.1, a mean of 2.204 against 2.405 at 1e-2) and DyT+scale's alpha0 at its
grid's top (8 at lr 3e-3, 2.221 against 2.237 at 4), so run.sh stopped before the judged runs. DyT's lrs (LRS_OF) gain
1e-1 and 3e-1 and DyT+scale's alpha0s gain 16 and 32; RMSNorm's and Derf+scale's grids and every other rule stay. The
128 pilot runs of the first grids stand (from 2af5528); the 18 added cells (36 runs) run from the amendment commit,
and each arm's cell is chosen again over its widened grid by the same rule.
Stage 2, the judged runs (seeds SEEDS, disjoint from the pilot's, one run per arm and seed): each arm at its cell.
A seed's arms share their initial weights and data order (the norms and the embedding scale draw nothing).
Every run enters as it ended: a diverged or crashed run at ln V, a completed one at its final val loss; a run stopped
by a signal, or short of its budget without diverging, stops the analysis (run.sh again resumes it), as do duplicate
runs of one arm, cell and seed, pilot runs off their grid, runs at other seeds and runs not in their arm's settings.

    bash experiments/studies/s8_dyt/r5_recipe/run.sh      # pilot, choice, judged runs, analysis

Compute: 128 pilot runs and 32 judged runs of 410k tokens at round 4's ~30 s of training and ~10 s of start-up
each, two processes side by side: ~55 min (the first grids' pilot took 31 min); the widening's 36 pilot runs ~10 min.

Premises (per part; an absent one makes the part "premise absent at this scale"):
  tuned: every arm the part compares has its chosen lr and alpha0 inside their grids.
  squashing (precondition tanh_saturation, read during training): for each embedding-scaled point-wise arm the part
    names, the share of its inputs with |alpha x| >= 1 (Derf's |alpha x + shift|) over every site, averaged over
    the logged steps from LATE x STEPS on, per judged seed; at least 1%; absent when no seed reaches it, and when no
    judged run of the arm logged it that late (every one diverged before); a judged run that ended without
    diverging or crashing and lacks it stops the analysis.
  Reported beside, deciding nothing: each point-wise arm's share at its first logged step.
Hypotheses (8 judged seeds, paired by seed, final val loss; each part's word from its own two-sided 1 - ALPHA / 4 t
interval, Bonferroni over the four: "confirmed" when the interval lies at or below the threshold, "not at this scale"
when wholly above it, "unresolved" when it crosses it. With every gap at its threshold the family gives any word with
a chance of at most ALPHA; a false word, which only one side can give for a true gap, at most ALPHA / 2):
  D1 (Zhu et al. 2025: DyT matches RMSNorm with alpha0 tuned): DyT+scale - RMSNorm at most +PARITY.
  D2 (Chen et al. 2025: Derf matches or beats the norm it replaces): Derf+scale - RMSNorm at most +PARITY.
  D3 (Chen et al. 2025: Derf beats DyT): Derf+scale - DyT+scale at most -BETTER.
  E3 (the recipes' embedding scale helps DyT: round 4's E3a on the recipes' init): DyT+scale - DyT at most -BETTER.
Reported, not tested: every pilot cell's mean; each arm's loss per seed; verdicts.json, the comparison engine's
verdicts (rules version 4, its defaults) of every arm against RMSNorm.
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
from minillm.metrics import VAL_LOSS, parse_metric

HERE = Path(__file__).parent
CHOICE = HERE / "choice.json"
# --- fixed before the runs ---------------------------------------------------------------------------------
STEPS, LATE = 400, 0.75
LRS = (1e-3, 3e-3, 1e-2, 3e-2)
ALPHA0S = {"dyt": (0.025, 0.05, 0.1, 0.2, 0.4), "dyt+scale": (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
           "derf+scale": (0.5, 1.0, 2.0, 4.0, 8.0)}  # the point-wise arms' alpha0 grids (dyt+scale's widened)
LRS_OF = {"rmsnorm": LRS, "dyt": (*LRS, 1e-1, 3e-1), "dyt+scale": LRS, "derf+scale": LRS}  # (dyt's widened)
PILOT_SEEDS, SEEDS = (0, 1), tuple(range(20, 28))
PARITY = 0.03  # nats: S8's parity threshold
BETTER = 0.01  # nats: "better" by at least this
ALPHA = 0.05  # the family's chance of any false word
TAG = "dyt_recipe"
ARMS = {"rmsnorm": ("rmsnorm", False), "dyt": ("dyt", False), "dyt+scale": ("dyt", True),
        "derf+scale": ("derf", True)}  # arm -> (norm, model.embed_scale)
SETTINGS = {"init": "gpt2", "warmup_steps": 40, "max_steps": STEPS}
PARTS = {  # name -> (what it compares, arm, against, threshold)
    "D1": ("DyT+scale - RMSNorm", "dyt+scale", "rmsnorm", PARITY),
    "D2": ("Derf+scale - RMSNorm", "derf+scale", "rmsnorm", PARITY),
    "D3": ("Derf+scale - DyT+scale", "derf+scale", "dyt+scale", -BETTER),
    "E3": ("DyT with - without the embedding scale", "dyt+scale", "dyt", -BETTER),
}
ENGINE_RULES = {"version": 4}  # the comparison engine's rules version when this round was pre-registered
SATURATION = "saturation"  # norm/<site>/saturation, the probe's share of a DyT's (or Derf's) inputs in its bend


def is_saturation(key: str) -> bool:
    return (parsed := parse_metric(key)) is not None and parsed[0] == "norm" and parsed[2] == SATURATION


def arm_of(run: dict) -> str | None:
    model = (run.get("settings") or {}).get("model") or {}
    return next((a for a, (norm, scaled) in ARMS.items()
                 if run.get("norm") == norm and bool(model.get("embed_scale")) == scaled), None)


def alpha0_of(run: dict) -> float | None:
    return None if run.get("norm") == "rmsnorm" else (run.get("norm_options") or {}).get("alpha0")


def grid(arm: str) -> list[tuple[float, float | None]]:
    """The arm's pilot cells (lr, alpha0); RMSNorm's alpha0 is None."""
    lrs = LRS_OF[arm]
    return [(lr, None) for lr in lrs] if arm == "rmsnorm" else [(lr, a) for lr in lrs for a in ALPHA0S[arm]]


def _at(run: dict, cell: tuple[float, float | None]) -> bool:
    alpha0 = alpha0_of(run)
    return math.isclose(run["lr"], cell[0]) and (alpha0 is None if cell[1] is None
                                                  else alpha0 is not None and math.isclose(alpha0, cell[1]))


def describe(cell: tuple[float, float | None]) -> str:
    return f"lr {cell[0]:g}" + ("" if cell[1] is None else f", alpha0 {cell[1]:g}")


def _checked(runs: Runs) -> Runs:
    """This round's runs (TAG), each one that ended, in its arm's settings, at a cell and seed of this round, at most
    one per arm, cell and seed."""
    runs = Runs(r for r in runs if TAG in (r.get("tags") or []))
    prereg.require_ended(runs)
    for r in runs:
        model = (r.get("settings") or {}).get("model") or {}
        got = {"init": model.get("init", r.get("init")), "warmup_steps": r.get("warmup_steps"),
               "max_steps": r.get("max_steps")}
        if arm_of(r) is None or (wrong := [f"{k} {got[k]!r} (the round's: {v!r})" for k, v in SETTINGS.items()
                                           if got[k] != v]):
            why = "no arm of this round" if arm_of(r) is None else ", ".join(wrong)
            raise SystemExit(f"{prereg.run_name(r)}: {why} (norm {r.get('norm')!r}, embed_scale "
                             f"{model.get('embed_scale')!r})")
    if off := [prereg.run_name(r) for r in runs if r["seed"] in PILOT_SEEDS
               and not any(_at(r, c) for c in grid(arm_of(r)))]:
        raise SystemExit(f"pilot run(s) off their arm's grid: {', '.join(off[:5])}")
    if seeds := sorted({r["seed"] for r in runs} - {*PILOT_SEEDS, *SEEDS}):
        raise SystemExit(f"runs at seeds this round does not have: {seeds}")
    prereg.require_once(runs, lambda r: (arm_of(r), round(math.log10(r["lr"]), 6), alpha0_of(r) or 0.0, r["seed"]),
                        lambda k: f"{k[0]} lr {10 ** k[1]:g}" + (f" alpha0 {k[2]:g}" if k[2] else "")
                        + f" seed {k[3]}")
    return runs


def choose(runs: Runs) -> dict:
    """Each arm's cell from the pilot (PILOT_SEEDS): the grid point of lower mean loss (prereg.ended_loss), with
    "edge" when its lr or alpha0 lies at its grid's edge; an arm without every pilot run stops the choice."""
    runs, out = _checked(runs), {}
    for a in ARMS:
        means = {}
        for cell in grid(a):
            vals = [prereg.ended_loss(r) for r in runs if arm_of(r) == a and r["seed"] in PILOT_SEEDS and _at(r, cell)]
            if len(vals) != len(PILOT_SEEDS):
                raise SystemExit(f"the pilot lacks {a} at {describe(cell)}: {len(vals)} of {len(PILOT_SEEDS)} seeds")
            means[cell] = mean(vals)
        lr, alpha0 = min(means, key=means.__getitem__)
        edge = lr in (LRS_OF[a][0], LRS_OF[a][-1]) or (alpha0 is not None and alpha0 in (ALPHA0S[a][0], ALPHA0S[a][-1]))
        out[a] = {"lr": lr, "alpha0": alpha0, "edge": edge, "pilot": {describe(c): m for c, m in means.items()}}
    return out


def saturation(run: dict, late: bool = True) -> float | None:
    """The share of a point-wise arm's inputs in its bend over every site: the mean over the logged steps from
    LATE x STEPS on of the sites' mean (``late``), or at the first logged step; None when nothing was logged."""
    sites = [pts for k, pts in (run.get("curves") or {}).items() if is_saturation(k) and pts]
    if not sites:
        return None
    if not late:
        return mean(pts[0][1] for pts in sites)
    values = [mean(v for s, v in pts if s >= LATE * STEPS) for pts in sites]
    return None if any(v is None for v in values) else mean(values)


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = _checked(runs)
    chosen = choose(runs)
    judged = Runs(r for r in runs if r["seed"] in SEEDS)
    prereg.require(judged, "the arm's chosen cell", lambda r: _at(r, (chosen[arm_of(r)]["lr"],
                                                                      chosen[arm_of(r)]["alpha0"])))
    val = {a: prereg.by_seed([r for r in judged if arm_of(r) == a], prereg.ended_loss) for a in ARMS}
    if missing := [f"{a} (seeds {sorted(set(SEEDS) - set(v))})" for a, v in val.items() if set(v) != set(SEEDS)]:
        raise SystemExit(f"judged runs missing: {'; '.join(missing)}")
    tuned = {a: pre.reported(f"a tuned {a}", f"the pilot's best cell ({len(PILOT_SEEDS)} seeds)",
                             "lr and alpha0 inside their grids", {a: describe((chosen[a]["lr"], chosen[a]["alpha0"]))},
                             "absent" if chosen[a]["edge"] else "present", "the pilot runs, this file's rule")
             for a in ARMS}
    pointwise = [a for a in ARMS if a != "rmsnorm"]
    ran = [r for r in judged if ARMS[arm_of(r)][1] and not r.get("diverged") and r.get("status") != "failed"]
    prereg.require(ran, "the saturation late in training (norm/<site>/saturation)", lambda r: saturation(r) is not None)
    late = {a: [saturation(r) for r in judged if arm_of(r) == a] for a in pointwise}
    squashing = pre.measure("tanh_saturation", {a: late[a] for a in pointwise if ARMS[a][1]},
                            f"during training: the mean over the logged steps from step {LATE * STEPS:g} on, every "
                            f"site, judged seeds {SEEDS[0]}-{SEEDS[-1]}")
    level = f"{100 * (1 - ALPHA / len(PARTS)):g}%"
    parts, verdicts = {}, {}
    for name, (text, arm, base, threshold) in PARTS.items():
        parts[name] = pre.against(prereg.diffs(val[arm], val[base]), threshold, "at most", ALPHA / len(PARTS))
        blocks = [tuned[arm], tuned[base], *(_squashing(squashing, a) for a in (arm, base) if a in squashing["cells"])]
        w = pre.gate(prereg.word(parts[name]), *blocks)
        verdicts[name] = (w, prereg.interval_line(name, parts[name], text, w, level))
    first = {a: mean(saturation(r, late=False) for r in judged if arm_of(r) == a) for a in pointwise}
    cells = lambda a, lr: [chosen[a]["pilot"][describe((lr, x))] for x in ALPHA0S[a]]  # noqa: E731
    pilot = "\n\n".join(f"{a}:\n\n" + table(["lr", *(f"alpha0 {x:g}" for x in ALPHA0S[a])],
                                                [[f"{lr:g}", *cells(a, lr)] for lr in LRS_OF[a]]) for a in pointwise)
    base_pilot = table(["arm", *(describe(c) for c in grid("rmsnorm"))],
                       [["rmsnorm", *(chosen["rmsnorm"]["pilot"][describe(c)] for c in grid("rmsnorm"))]])
    rows = [[a, describe((chosen[a]["lr"], chosen[a]["alpha0"])), mean(val[a].values()),
             "" if a == "rmsnorm" else first[a], "" if a == "rmsnorm" else mean(late[a]),
             " / ".join(f"{v:.3f}" for _, v in sorted(val[a].items()))] for a in ARMS]
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"Machine: {runs_machine(runs)}, from {runs_commits(runs)}; pilot seeds {PILOT_SEEDS[0]}-{PILOT_SEEDS[-1]}, "
          f"judged seeds {SEEDS[0]}-{SEEDS[-1]}, {STEPS} steps, init gpt2.\n\n"
          f"### Stage 1, the pilot: mean final val loss (diverged or crashed at ln V)\n\n{base_pilot}\n\n{pilot}\n\n"
          + "\n\n".join(pre.line(g) for g in tuned.values())
          + "\n\n### Stage 2, the judged runs (diverged or crashed at ln V)\n\n"
          f"{table(['arm', 'cell', 'val loss (mean)', 'saturated, first step', 'saturated, late', 'per seed'], rows)}"
          f"\n\n{pre.line(squashing)}\n\n"
          f"### Verdicts (rules fixed before the runs; each part on its own {level} interval)\n\n{vt}\n\n"
          f"verdicts.md: minillm.analysis.compare's verdicts, every arm against RMSNorm.\n")
    return {"choice": chosen, "val": val, "verdicts": verdicts, "parts": parts,
            "saturation": {"first": first, "late": late}, "precondition": [*tuned.values(), squashing]}, md


def _squashing(block: dict, arm: str) -> dict:
    """The squashing gate of one arm: its cell of the measured block, absent as well when nothing was recorded late
    (every judged run of the arm diverged before)."""
    cell = pre.cell(block, arm)
    return {**cell, "status": "absent"} if cell["status"] == "not recorded" else cell


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare, every arm's judged runs against RMSNorm's."""
    judged = [{**r, "arm": arm_of(r)} for r in _checked(runs) if r["seed"] in SEEDS]
    return compare(judged, "arm", "rmsnorm", **ENGINE_RULES)


def plot(runs: Runs, out: Path) -> None:
    """The pilot's loss against alpha0 at each arm's chosen lr; each part's judged gap with its interval; the
    saturation over training of the judged point-wise runs."""
    plt = pyplot()
    res, _ = analyze(runs)
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for i, a in enumerate(ARMS):
        c = res["choice"][a]
        if a == "rmsnorm":
            axes[0].axhline(c["pilot"][describe((c["lr"], None))], color="k", ls="--", lw=1, label="RMSNorm, its lr")
            continue
        pts = [(alpha0, c["pilot"][describe((c["lr"], alpha0))]) for alpha0 in ALPHA0S[a]]
        axes[0].plot(*zip(*pts, strict=True), "o-", color=f"C{i}", label=f"{a}, lr {c['lr']:g}")
    axes[0].set(xscale="log", xlabel="alpha0", ylabel="pilot mean final val loss (failed: ln V)",
                title=f"pilot, seeds {PILOT_SEEDS[0]}-{PILOT_SEEDS[-1]}, each arm at its chosen lr")
    axes[0].legend(fontsize=8)
    for i, (name, (_, arm, base, threshold)) in enumerate(PARTS.items()):
        gaps, part = prereg.diffs(res["val"][arm], res["val"][base]), res["parts"][name]
        axes[1].scatter([i] * len(gaps), gaps, color="C1", alpha=0.4, s=12)
        axes[1].errorbar([i], [part["mean"]], yerr=[[part["mean"] - part["ci_low"]], [part["ci_high"] - part["mean"]]],
                         fmt="o", color="k", capsize=4)
        axes[1].plot([i - 0.3, i + 0.3], [threshold] * 2, color="C3", ls="--", lw=1)
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].set(xticks=range(len(PARTS)), xticklabels=list(PARTS), ylabel="paired gap (nats)",
                title=f"judged seeds: mean, {100 * (1 - ALPHA / len(PARTS)):g}% CI, each seed; red: threshold")
    for i, a in enumerate(ARMS):
        for k, r in enumerate(r for r in runs if TAG in (r.get("tags") or []) and arm_of(r) == a
                              and r["seed"] in SEEDS):
            sites = [pts for key, pts in r["curves"].items() if is_saturation(key) and pts]
            if sites:
                steps = [s for s, _ in sites[0]]
                axes[2].plot(steps, [mean(v) for v in zip(*([v for _, v in p] for p in sites), strict=True)],
                             color=f"C{i}", alpha=0.5, label=a if k == 0 else None)
    axes[2].axhline(0.01, color="C3", ls="--", lw=1, label="the premise's 1%")
    axes[2].axvline(LATE * STEPS, color="grey", lw=0.8)
    axes[2].set_yscale("symlog", linthresh=0.01)
    axes[2].set(xlabel="step", ylabel="share of inputs with |alpha x| >= 1", ylim=(0, 1.05),
                title="saturation over training (every site), judged seeds")
    axes[2].legend(fontsize=8)
    save(fig, out / "recipe.png")


ARM_OVERRIDES = {"rmsnorm": ["norm=rmsnorm"], "dyt": ["norm=dyt"], "dyt+scale": ["norm=dyt", "model.embed_scale=true"],
                 "derf+scale": ["norm=derf", "model.embed_scale=true"]}


def sweeps(stage: Sequence[str]) -> None:
    """run.sh's sweeps of a stage, one per line: its folder, then its overrides. "pilot": each arm over its grid at
    the pilot seeds; "judged": each arm at its chosen cell (choice.json) at the judged seeds."""
    seeds = lambda ss: "seed=" + ",".join(map(str, ss))  # noqa: E731
    for a, overrides in ARM_OVERRIDES.items():
        folder = a.replace("+", "_")
        if stage == ["pilot"]:
            grid_ = ["optimizer.lr=" + ",".join(f"{lr:g}" for lr in LRS_OF[a])]
            if a != "rmsnorm":
                grid_.append("model.norm_options.alpha0=" + ",".join(f"{x:g}" for x in ALPHA0S[a]))
            print(f"pilot_{folder}", *overrides, *grid_, seeds(PILOT_SEEDS))
        elif stage == ["judged"]:
            c = json.loads(CHOICE.read_text())[a]
            cell = [f"optimizer.lr={c['lr']:g}", *([] if c["alpha0"] is None else
                                                   [f"model.norm_options.alpha0={c['alpha0']:g}"])]
            print(f"judged_{folder}", *overrides, *cell, seeds(SEEDS))
        else:
            raise SystemExit(f"--print-sweeps {' '.join(stage)}: allowed: pilot, judged")


def write_choice(folders: list[str]) -> None:
    """Each arm's pilot cell from the sweep folders, into choice.json; a chosen lr or alpha0 at its grid's edge stops
    with one line after it is written."""
    chosen = choose(Runs({**run.summary, "curves": {}} for folder in folders for run in find_runs(folder)))
    CHOICE.write_text(json.dumps(chosen, indent=1) + "\n")
    print(" ".join(f"{a}={describe((c['lr'], c['alpha0']))}" for a, c in chosen.items()).replace(", ", ","))
    if edges := [f"{a} {describe((c['lr'], c['alpha0']))}" for a, c in chosen.items() if c["edge"]]:
        raise SystemExit(f"the pilot's cell lies at its grid's edge for {'; '.join(edges)} ({CHOICE.name}): "
                         "widen that grid in a new pre-registration commit before any judged run")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == VAL_LOSS or is_saturation(k), analyze, plot,
                  argv, engine=engine,
                  stages={"--choose": ("the pilot's sweep folders: each arm's lr and alpha0 into choice.json; a "
                                       "chosen one at its grid's edge stops it", write_choice),
                          "--print-sweeps": ("pilot or judged: that stage's sweeps for run.sh, one per line (folder, "
                                             "then overrides; judged reads choice.json)", sweeps)})


if __name__ == "__main__":
    main()
