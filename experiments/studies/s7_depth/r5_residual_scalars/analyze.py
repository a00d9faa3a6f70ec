"""S7 round 5 (pre-registered): do the residual-branch scalars let a 48-layer model train without a norm, or with
Post-LN? ReZero (Bachlechner et al. 2021: each sublayer's branch times a scalar initialized at 0, no norm) and
LayerScale (Touvron et al. 2021, CaiT: a per-channel vector initialized small, 1e-6 at this depth) make every block
start as the identity, which their papers report lets deep Transformers train without warmup tricks or norms. Round
4 confirmed Post-LN stalling at 48 layers (6 of 10 seeds) in this setting. The rules below are committed before any
run; the data commit cites this one.

Setting: configs/experiment/s7_depth.yaml at L=48 (LayerNorm, dim 64, 4 heads, 300 steps, lr 3e-3, warmup 40, no
clipping, GPT-2's init; 2.6M parameters, 0.12 tokens per parameter), fresh seeds 20-29, six arms (model.branch_scale
with its default inits: ReZero 0, LayerScale 1e-6 at depth > 24):
  post, post+rezero, post+layerscale      Post-LN LayerNorm
  none, none+rezero, none+layerscale      norm=none (no norm anywhere, the final norm included)
60 runs, one commit: run.sh beside this file.

    bash experiments/studies/s7_depth/r5_residual_scalars/run.sh        # JOBS=2 on a quiet machine

Compute estimate (round 4: 40 runs of L=48 in ~2 h with two processes beside other work): ~2.5 h with two
processes; failed runs that trip the divergence guard end early.

Measure, per run: "failed" = diverged, not trained, or stalled (final val loss within STALL_MARGIN nats of the
unigram loss or above it: S7's stall rule, minillm.outcome.is_stalled; or minillm.outcome.failed_of).
Preconditions (the gates, read first, each on this round's runs):
  PP (Post-LN fails at this depth): at least MIN_FAILS of 10 post runs failed. Absent: Z reads premise absent.
  PN (no norm fails at this depth): at least MIN_FAILS of 10 none runs failed. Absent: N reads premise absent.
Hypotheses (10 seeds per arm; the one-sided Fisher exact test of "the arm without the scalar fails more often",
minillm.analysis.stats.fisher_p, Holm within each question's two scalars):
  Z-rezero, Z-layerscale (the scalar lets Post-LN train): post+s fails in at most SUFFICES of 10 runs and the
    Holm-adjusted p < ALPHA: "confirmed"; post+s fails at least as often as post: "not at this scale"; otherwise
    "unresolved".
  N-rezero, N-layerscale (the scalar lets a model without norms train): the same for none+s against none.
Reported, not tested: each arm's failure rate with its Clopper-Pearson interval and the mean final val loss of its
runs that trained. Beside the rules, added after the data and deciding nothing: verdicts.json,
minillm.analysis.compare's default verdicts of each scalar against none within each norm.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import Runs, analysis_main, mean, rate_ci, table
from minillm.analysis import stats as st
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_V2
from minillm.metrics import TRAIN_LOSS
from minillm.outcome import failed_of, final_loss, is_stalled

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
DEPTH, SEEDS = 48, tuple(range(20, 30))
STALL_MARGIN = 0.25  # S7's stall rule (rounds 1-4)
MIN_FAILS = 2  # S7's: a placement "fails at depth" when at least 2 of its runs fail
SUFFICES = 1  # round 4's: a remedy "suffices" when its arm fails in at most 1 of 10
ALPHA = 0.05
BASES, SCALARS = ("post", "none"), ("rezero", "layerscale")
ARMS = tuple(f"{b}{'' if s == 'none' else '+' + s}" for b in BASES for s in ("none", *SCALARS))
QUESTION = {"post": "Z", "none": "N"}


def scalar_of(run: dict) -> str:
    return ((run.get("settings") or {}).get("model") or {}).get("branch_scale") or "none"


def arm_of(run: dict) -> str | None:
    base = "none" if run.get("norm") == "none" else "post" if run.get("placement") == "post" else None
    scalar = scalar_of(run)
    return None if base is None else base if scalar == "none" else f"{base}+{scalar}"


def of_this_round(runs: Runs) -> Runs:
    return Runs(r for r in runs if r.get("n_layers") == DEPTH and r["seed"] in SEEDS and arm_of(r) is not None)


def failed(run: dict) -> bool:
    return failed_of(run) or is_stalled(run, STALL_MARGIN)


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = of_this_round(runs)
    count = {a: (sum(failed(r) for r in runs if arm_of(r) == a), sum(arm_of(r) == a for r in runs)) for a in ARMS}
    gates = {}
    for base in BASES:
        k, n = count[base]
        status = "not recorded" if n == 0 else "present" if k >= MIN_FAILS else "absent"
        gates[base] = pre.reported(f"{'Post-LN' if base == 'post' else 'a model without norms'} fails at L={DEPTH}",
                                   "failed runs (diverged, not trained or stalled) of 10", f"at least {MIN_FAILS}",
                                   {f"L={DEPTH}": f"{k}/{n}"}, status, "this round's runs")
    tests = {}
    for base in BASES:
        names = [f"{QUESTION[base]}-{s}" for s in SCALARS]
        ps = [st.fisher_p(*count[base], *count[f"{base}+{s}"], alternative="greater") for s in SCALARS]
        for name, s, p, p_adj in zip(names, SCALARS, ps, st.holm(ps), strict=True):
            (k, n), (kb, nb) = count[f"{base}+{s}"], count[base]
            word = ("unresolved" if n == 0 or nb == 0 else
                    "confirmed" if k <= SUFFICES and p_adj is not None and p_adj < ALPHA else
                    "not at this scale" if k / n >= kb / nb else "unresolved")
            why = (f"{name}: {base}+{s} failed {k}/{n} against {base} {kb}/{nb}, one-sided Fisher p "
                   f"{_p(p)}, Holm-adjusted within {QUESTION[base]} {_p(p_adj)}")
            tests[name] = (pre.gate(word, gates[base]), why)
    trained = {a: mean(final_loss(r) for r in runs if arm_of(r) == a and not failed(r)) for a in ARMS}
    rows = [[a, rate_ci(*count[a]), trained[a]] for a in ARMS]
    tab = table(["arm", "failed (95% CI)", "final val loss of the runs that trained (mean)"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in tests.items()])
    md = (f"L = {DEPTH}, LayerNorm where a norm is used, seeds {SEEDS[0]}-{SEEDS[-1]}, {len(runs)} runs.\n\n{tab}\n\n"
          f"{pre.line(gates['post'])}\n\n{pre.line(gates['none'])}\n\n### Verdicts (rules fixed before the runs)\n\n"
          f"{vt}\n")
    return {"failed": {a: list(c) for a, c in count.items()}, "trained_loss": trained, "verdicts": tests,
            "precondition": list(gates.values())}, md


def plot(runs: Runs, out: Path) -> None:
    """scalars.png (drawn after the rules were committed; it decides nothing): every run's train loss per arm, the
    failed runs red, the unigram loss dashed."""
    runs = of_this_round(runs)
    plt = pyplot()
    fig, axes = plt.subplots(len(BASES), 1 + len(SCALARS), figsize=(12, 6.4), sharex=True, sharey=True)
    for ax, arm in zip(axes.flat, ARMS, strict=True):
        mine = sorted((r for r in runs if arm_of(r) == arm), key=lambda r: r["seed"])
        for r in mine:
            if r["curves"].get(TRAIN_LOSS):
                ax.plot(*xy(r["curves"][TRAIN_LOSS]), lw=0.8, alpha=0.8, color="tab:red" if failed(r) else "tab:blue")
        if mine:
            ax.axhline(mean(r["unigram_loss"] for r in mine), ls="--", color="k", lw=0.8, label="unigram loss")
        ax.set_title(f"{arm}: {sum(map(failed, mine))}/{len(mine)} failed", fontsize=9)
        ax.set_ylim(1.8, 4.8)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for ax in axes[:, 0]:
        ax.set_ylabel("train loss (red: failed)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"L = {DEPTH}: Post-LN (top) and no norm (bottom), without a scalar, ReZero, LayerScale", fontsize=10)
    save(fig, out / "scalars.png")


def engine(runs: Runs) -> dict:
    """verdicts.json (added after the data; decides nothing): minillm.analysis.compare with its default rules,
    ReZero and LayerScale against no scalar within each norm (failures counted at ln V, Holm over the family)."""
    return compare([{**r, "branch_scale": scalar_of(r)} for r in of_this_round(runs)], "branch_scale", "none",
                   **REGISTERED_V2)


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.3f}"


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == TRAIN_LOSS, analyze, plot, argv, engine=engine)


if __name__ == "__main__":
    main()
