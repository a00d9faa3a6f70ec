"""S4 round 2: PowerNorm, Shen et al.'s own fix, beside BatchNorm and LayerNorm, and BatchNorm's fluctuation
measured against the floor that sampling alone sets. Pre-registered: the rules below were committed before any
run of this round (the README names the commit). Results go to this round's folder.

    python train.py -m experiment=s4_batchnorm norm=batchnorm,layernorm hydra/launcher=joblib \\
        hydra.launcher.n_jobs=2 hydra.sweep.dir=logs/s4_batchnorm/multiruns/round2_bn_ln          # 12 runs
    python train.py -m experiment=s4_batchnorm norm=powernorm model.norm_options.group_scaling=1 \\
        model.norm_options.warmup_steps=40 hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s4_batchnorm/multiruns/round2_pn                                      # 6 runs
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s4_batchnorm.r2_powernorm.analyze logs/s4_batchnorm/multiruns/round2_*

PowerNorm runs as the authors' released code does (GroupScaling1D with one group, i.e. each token divided by
its RMS first, and a warmup on batch statistics: 10% of training, 40 of 400 steps, as their 10k iterations of
~100k); per-position statistics keep it causal (minillm.norms.PowerNorm).

Hypotheses, each with its source:
  F (Shen et al. 2020, section 3: in NLP the batch statistics fluctuate strongly around the running ones, which
     makes BatchNorm unstable): BatchNorm's batch-mean distance from the running mean, in units of the running
     std (norm/<site>/bn_mean_z), RMS over sites and the logged steps of the second half of training, divided
     by the i.i.d. sampling null of minillm.training.callbacks.bn_sampling_null (1.0 = sampling alone). Confirmed: the
     ratio is >= EXCESS at both batch sizes (every seed); partly: at one; not at this scale: at none.
  P1 (Shen et al. 2020: PowerNorm matches or beats LayerNorm; language modelling on PTB / WikiText-103):
     PowerNorm's mean val loss at batch 64 minus LayerNorm's. Confirmed: <= max(MARGIN, 2 x the larger seed
     range); not at this scale: above.
  P2 (Shen et al. 2020: PowerNorm removes BatchNorm's failure; S0's textbook reason: the failure is worst at
     small batch):
     at batch 4, no PowerNorm run fails (minillm.outcome's rule, eval mode: the running statistics) and its mean
     val loss is within max(MARGIN, 2 x the larger seed range) of LayerNorm's. Confirmed: both; partly: no
     failure but further from LayerNorm; not at this scale: a run fails.
  Replication of round 1 (same code path, new runs): BatchNorm fails at batch 4 (every seed), not at batch 64.
Beside the rules, not part of them: the 95% paired t interval of PN - LN over the seeds
(minillm.analysis.stats.paired_t),
and verdicts.json (.md, .png): minillm.analysis.compare's verdicts, each norm against LayerNorm per batch size, margin
MARGIN
(what `minillm-report <sweeps> --compare norm --baseline layernorm --margin 0.05` gives).

Added after the data (the rules above are unchanged; experiments.common.precondition):
  F and P2 could not fail, and are restated as OBSERVATIONs (their rule's word in the text). F: each (position,
     feature) statistic is taken over B windows drawn at random from the corpus, which are i.i.d. by construction,
     so the fluctuation equals the i.i.d. sampling null up to its own noise. P2: PowerNorm's group scaling divides
     each token by its own RMS first (a per-token RMS norm), which removes BatchNorm's train/eval mismatch by design;
     PowerNorm without group scaling was not run, so PowerNorm's own mechanism is not tested (S4 round 3 is its
     pre-registration).
  provenance  the commit, kernels and torch version of each norm's runs (PowerNorm's came from another commit).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common.machine import provenance, runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import Runs, analysis_main, by_seed, ci, mean, paired, spread, table
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_BEFORE
from minillm.metrics import TRAIN_LOSS, VAL_LOSS, parse_metric
from minillm.outcome import failed_of, final_loss
from minillm.training.callbacks import bn_sampling_null

HERE = Path(__file__).parent
NORMS = ("batchnorm", "powernorm", "layernorm")
# --- fixed before the runs ---------------------------------------------------------------------------------
EXCESS = 2.0  # F: fluctuation "beyond sampling" when >= 2x the i.i.d. null
MARGIN = 0.05  # nats: P1 / P2 parity with LayerNorm (the round-1 threshold)
MOMENTUM = 0.1  # BatchNorm's running-statistics momentum in these runs (configs/norm/batchnorm.yaml)


def is_bn_z(key: str, which: str = "bn_mean_z") -> bool:
    return (parse_metric(key) or ("", "", ""))[::2] == ("norm", which)


def fluctuation(run: dict, which: str = "bn_mean_z") -> float | None:
    """RMS over BatchNorm sites and the logged steps of the second half of training of norm/<site>/<which>."""
    half = run["max_steps"] / 2
    values = [v for k, pts in run["curves"].items() if is_bn_z(k, which) for s, v in pts if s > half]
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else None


def cell(runs: Runs, norm: str, batch: int) -> dict:
    rs = sorted(runs.where(norm=norm, batch_size=batch), key=lambda r: r["seed"])
    val = [final_loss(r) for r in rs]
    out = {"runs": len(rs), "val": mean(val), "range": spread(val), "val_per_seed": [r.get("final_val_loss")
                                                                                     for r in rs],
           "failed": sum(map(failed_of, rs)), "diverged": sum(bool(r.get("diverged")) for r in rs)}
    if norm == "batchnorm":
        null_mu, null_var = bn_sampling_null(batch, MOMENTUM)
        out["z_mean"] = [fluctuation(r) for r in rs]
        out["excess_mean"] = [z / null_mu if z is not None else None for z in out["z_mean"]]
        out["excess_var"] = [z / null_var if z is not None else None for z in (fluctuation(r, "bn_var_z")
                                                                                for r in rs)]
        out["null_mean"] = null_mu
    return out


def analyze(runs: Runs) -> tuple[dict, str]:
    batches = runs.values("batch_size")
    cells = {(n, b): cell(runs, n, b) for n in NORMS for b in batches}
    rows = [[n, b, c["val"], c["range"], " / ".join(f"{v:.3f}" for v in c["val_per_seed"]),
             f"{c['failed']} / {c['diverged']}"] for (n, b), c in cells.items()]
    main = table(["norm", "batch", "val loss, eval mode (not diverged)", "seed range", "per seed",
                  "failed / diverged"], rows)
    fl_rows = [[b, cells["batchnorm", b]["null_mean"], " / ".join(f"{z:.3f}" for z in cells["batchnorm", b]["z_mean"]),
                " / ".join(f"{e:.2f}" for e in cells["batchnorm", b]["excess_mean"]),
                " / ".join(f"{e:.2f}" for e in cells["batchnorm", b]["excess_var"])] for b in batches]
    fl = table(["batch", "sampling null of z (mean)", "observed z (mean), per seed", "excess over null (mean)",
                "excess over Gaussian null (variance)"], fl_rows)

    verdicts = {}
    above = [b for b in batches if all(e is not None and e >= EXCESS for e in cells["batchnorm", b]["excess_mean"])]
    f_word = "confirmed" if len(above) == len(batches) else "partly" if above else "not at this scale"
    verdicts["F"] = (pre.OBSERVATION, f"could not fail (windows drawn at random are i.i.d. by construction, so the "
                     f"fluctuation is the sampling null); by its rule: {f_word}; excess >= {EXCESS:g} at batch(es) "
                     f"{above or 'none'}")
    small, large = min(batches), max(batches)

    def gap(b: int) -> tuple[float, float]:
        pn, ln = cells["powernorm", b], cells["layernorm", b]
        noise = max(pn["range"] or 0, ln["range"] or 0)
        return (pn["val"] - ln["val"] if pn["val"] is not None else math.inf), max(MARGIN, 2 * noise)

    def interval(b: int) -> str:
        return ci(paired(*(by_seed(runs.where(norm=n, batch_size=b), final_loss) for n in ("powernorm", "layernorm"))))

    d, tol = gap(large)
    verdicts["P1"] = ("confirmed" if d <= tol else "not at this scale", f"PN - LN at batch {large}: {d:+.3f}, 95% "
                      f"CI {interval(large)} (tolerance {tol:.3f})")
    d, tol = gap(small)
    fails = cells["powernorm", small]["failed"]
    p2_word = "not at this scale" if fails else "confirmed" if d <= tol else "partly"
    verdicts["P2"] = (pre.OBSERVATION, f"could not fail as a test of PowerNorm (its group scaling is a per-token RMS "
                      f"norm, which has no train/eval mismatch by design; PowerNorm without it was not run); by its "
                      f"rule: {p2_word}; {fails} PN run(s) failed at batch {small}; PN - LN {d:+.3f}, 95% CI "
                      f"{interval(small)} (tolerance {tol:.3f})")
    bn_s, bn_l = cells["batchnorm", small], cells["batchnorm", large]
    verdicts["replication"] = ("reproduced" if bn_s["failed"] == bn_s["runs"] and not bn_l["failed"] else
                               "not reproduced", f"BN failed {bn_s['failed']}/{bn_s['runs']} at batch {small}, "
                               f"{bn_l['failed']}/{bn_l['runs']} at batch {large}")
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    gate = pre.none(f"P1 compares two norms; the failure P2 was about, BatchNorm's at batch {small}, occurred in "
                    f"{bn_s['failed']} of {bn_s['runs']} runs")
    md = (f"Machine: {runs_machine(runs)}. {len(runs)} runs.\n\n{main}\n\n{pre.line(gate)}\n\n"
          f"{provenance(runs, lambda r: r['norm'])}\n\n### BatchNorm's fluctuation against sampling "
          f"(second half of training)\n\n{fl}\n\n### Verdicts (rules fixed before the runs; F's and P2's "
          f"restatement added after the data)\n\n{vt}\n\n"
          f"The intervals are beside the rules, not part of them: minillm.analysis.stats' paired t over the seeds. "
          f"verdicts.md: minillm.analysis.compare's verdicts.\n")
    return {"cells": [{"norm": n, "batch_size": b, **c} for (n, b), c in cells.items()],
            "verdicts": verdicts, "precondition": [gate], "machine": runs_machine(runs)}, md


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    batches = runs.values("batch_size")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for j, b in enumerate(batches):
        null_mu, _ = bn_sampling_null(b, MOMENTUM)
        for k, r in enumerate(runs.where(norm="batchnorm", batch_size=b)):
            by_step = defaultdict(list)
            for key, pts in r["curves"].items():
                if is_bn_z(key):
                    for s, v in pts:
                        by_step[s].append(v * v)
            steps, z = xy([(s, math.sqrt(sum(v) / len(v)) / null_mu) for s, v in sorted(by_step.items())])
            axes[0].plot(steps, z, color=f"C{j}", alpha=0.7, label=f"batch {b}" if k == 0 else None)
    axes[0].axhline(1.0, color="k", lw=0.8, ls=":", label="sampling alone")
    axes[0].axhline(EXCESS, color="r", lw=0.8, ls="--", label=f"threshold {EXCESS:g}x")
    axes[0].set(yscale="log", xlabel="step", ylabel="z(batch mean) / i.i.d. null",
                title="BatchNorm: fluctuation beyond sampling")
    axes[0].legend(fontsize=8)
    width = 0.8 / len(NORMS)
    for i, norm in enumerate(NORMS):
        for j, b in enumerate(batches):
            vals = [v for v in (final_loss(r) for r in runs.where(norm=norm, batch_size=b)) if v is not None]
            axes[1].bar(j + i * width, mean(vals) or 0, width, color=f"C{i + 2}", label=norm if j == 0 else None)
            axes[1].scatter([j + i * width] * len(vals), vals, color="k", s=8, zorder=3)
    axes[1].set(xticks=[j + width for j in range(len(batches))], xticklabels=[f"batch {b}" for b in batches],
                ylabel="val loss, eval mode (nats/char)", ylim=(1.5, None), title="final val loss per seed")
    axes[1].legend(fontsize=8)
    save(fig, out / "round2.png")


def main(argv: Sequence[str] | None = None) -> None:
    keep = (lambda k: k in (TRAIN_LOSS, VAL_LOSS) or is_bn_z(k) or is_bn_z(k, "bn_var_z"))
    analysis_main(__doc__, HERE, keep, analyze, plot, argv, engine=engine)


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare, each norm against LayerNorm per batch size, margin MARGIN."""
    return compare(runs, "norm", "layernorm", margin=MARGIN, **REGISTERED_BEFORE)


if __name__ == "__main__":
    main()
