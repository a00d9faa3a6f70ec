"""S8 round 4 (pre-registered): Derf against DyT and RMSNorm in S8's setting, with and without the embedding scale.

Chen, Lu, Zhu, Sun & Liu 2025 ("Stronger Normalization-Free Transformers") replace DyT's tanh by erf with a learnable
shift, Derf(x) = w * erf(alpha x + s) + b, and report that Derf beats DyT and the norms it replaces. S8 round 2 found
DyT (alpha0 0.5) behind RMSNorm by +0.079 nats, 95% CI [+0.021, +0.137], in this setting. Does Derf close that gap?
DyT's and Derf's language-model recipes also multiply the embeddings by a learnable scalar initialized at sqrt(C)
(model.embed_scale): does it help here? The rules below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s8_dyt.yaml (Pre-LN, dim 64, 4 layers, 4 heads, ~0.225M parameters, batch 16 x 64
characters), model.init=xavier (unit-scale embeddings, round 2's: DyT's tanh saturates there), lr 3e-3, warmup 40
+ cosine, 400 steps (410k tokens, 1.8 tokens per parameter), seeds 0-4. Arms: RMSNorm; DyT alpha0 0.5; Derf alpha0
0.5; DyT and Derf with model.embed_scale=true (the embeddings start at sqrt(64) = 8 times their unit scale).

    S="python train.py -m experiment=s8_dyt model.init=xavier optimizer.lr=3e-3 seed=0,1,2,3,4"
    $S norm=rmsnorm 'tags=[derf]' hydra.sweep.dir=logs/s8_dyt/multiruns/derf_rmsnorm                  # 5 runs
    $S norm=dyt,derf 'tags=[derf]' hydra.sweep.dir=logs/s8_dyt/multiruns/derf_pointwise               # 10 runs
    $S norm=dyt,derf model.embed_scale=true 'tags=[derf,embscale]' \\
       hydra.sweep.dir=logs/s8_dyt/multiruns/derf_embscale                                             # 10 runs
    python -m experiments.studies.s8_dyt.r4_derf.analyze --premise      # premise.json, before the runs (~1 min)
    python -m experiments.studies.s8_dyt.r4_derf.analyze logs/s8_dyt/multiruns/derf_*

Compute: 25 runs of 410k tokens at ~15,000 tokens/s (round 1's DyT runs), one process: ~12 min of training plus
start-up, about 20 min on one core.

Premise (experiments.common.precondition, tanh_saturation, fixed before the runs): at least 1% of the inputs of the
point-wise norms have |alpha x| >= 1 at init (erf(1) = 0.84: its bend starts where tanh's does), measured per arm
and seed on the 128 val windows before any step (premise.json). An arm whose premise is absent reads "premise
absent at this scale".
Hypotheses (5 seeds paired by seed, final val loss; each read with its 95% interval, Holm across E1-E3b):
  E1 (Chen et al.: Derf beats DyT): Derf - DyT at most -BETTER.
  E2 (Chen et al.: Derf matches or beats the norm; "does Derf close DyT's gap"): Derf - RMSNorm at most PARITY
     (S8's parity threshold).
  E3 (the recipes' embedding scale helps the point-wise norms): with - without at most -BETTER, for DyT (E3a) and
     Derf (E3b).
Beside the rules: verdicts.json, minillm.analysis.compare's default verdicts of every arm against RMSNorm.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import Runs, analysis_main, mean, table
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_V2
from minillm.metrics import VAL_LOSS
from minillm.outcome import final_loss

HERE = Path(__file__).parent
PREMISE = HERE / "premise.json"
# --- fixed before the runs ---------------------------------------------------------------------------------
STEPS, SEEDS = 400, (0, 1, 2, 3, 4)
PARITY = 0.03  # nats: S8's parity threshold
BETTER = 0.01  # nats: "better" by at least this
ARMS = ("rmsnorm", "dyt", "derf", "dyt+scale", "derf+scale")
POINTWISE = ARMS[1:]


def arm(run: dict) -> str:
    return run["norm"] + ("+scale" if "embscale" in (run.get("tags") or []) else "")


def analyze(runs: Runs, premise: dict[str, list[float]] | None = None) -> tuple[dict, str]:
    runs = Runs(r for r in runs if "derf" in (r.get("tags") or []) and r.get("max_steps") == STEPS)
    premise = premise if premise is not None else json.loads(PREMISE.read_text())
    missing = [a for a in POINTWISE if a not in premise]
    if missing:
        raise SystemExit(f"premise.json lacks the saturation at init of {missing}: run --premise before the runs")
    val = {a: prereg.by_seed((r for r in runs if arm(r) == a), final_loss) for a in ARMS}
    gate = pre.measure("tanh_saturation", {a: premise[a] for a in POINTWISE},
                       "at init, before any step, 128 val windows, seeds 0-4 (premise.json)")
    parts = pre.parts({"E1": (prereg.diffs(val["derf"], val["dyt"]), -BETTER, "at most"),
                       "E2": (prereg.diffs(val["derf"], val["rmsnorm"]), PARITY, "at most"),
                       "E3a": (prereg.diffs(val["dyt+scale"], val["dyt"]), -BETTER, "at most"),
                       "E3b": (prereg.diffs(val["derf+scale"], val["derf"]), -BETTER, "at most")})
    texts = {"E1": ("Derf - DyT", ("derf", "dyt")), "E2": ("Derf - RMSNorm", ("derf",)),
             "E3a": ("DyT with - without the embedding scale", ("dyt+scale", "dyt")),
             "E3b": ("Derf with - without the embedding scale", ("derf+scale", "derf"))}
    verdicts = {}
    for name, (text, arms) in texts.items():
        w, why = prereg.verdict_line(name, parts["parts"][name], text)
        verdicts[name] = (pre.gate(w, *(pre.cell(gate, a) for a in arms)), why)
    rows = [[a, len(val[a]), mean(val[a].values()), " / ".join(f"{v:.3f}" for _, v in sorted(val[a].items()))]
            for a in ARMS]
    gaps = [[a, *_gap(val[a], val["rmsnorm"])] for a in POINTWISE]
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"Machine: {runs_machine(runs)}. {len(runs)} runs, {STEPS} steps, init xavier, lr 3e-3.\n\n"
          f"{table(['arm', 'runs', 'val loss (mean)', 'per seed'], rows)}\n\n"
          f"{table(['arm', 'minus RMSNorm (seed mean)', '95% CI'], gaps)}\n\n{pre.line(gate)}\n\n"
          f"### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n\n"
          f"verdicts.md: minillm.analysis.compare's default verdicts, every arm against RMSNorm.\n")
    return {"val": val, "verdicts": verdicts, "precondition": [gate], "holm": parts, "machine": runs_machine(runs)}, md


def _gap(arm_: dict[int, float], base: dict[int, float]) -> list[str]:
    r = pre.against(prereg.diffs(arm_, base), 0.0, "at most")
    ci = "-" if r["ci_low"] is None else f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
    return [f"{r['mean']:+.3f}" if r["mean"] is not None else "-", ci]


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare with its default rules, every arm against RMSNorm."""
    return compare([{**r, "arm": arm(r)} for r in runs if "derf" in (r.get("tags") or [])], "arm", "rmsnorm",
                   **REGISTERED_V2)


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, a in enumerate(ARMS):
        rs = [r for r in runs if arm(r) == a and "derf" in (r.get("tags") or [])]
        vals = [v for v in map(final_loss, rs) if v is not None]
        axes[0].bar(i, mean(vals) or 0, color=f"C{i}")
        axes[0].scatter([i] * len(vals), vals, color="k", s=8, zorder=3)
        for k, r in enumerate(rs):
            pts = r["curves"].get(VAL_LOSS) or []
            if pts:
                axes[1].plot(*xy(pts), color=f"C{i}", alpha=0.6, label=a if k == 0 else None)
    axes[0].set(xticks=range(len(ARMS)), xticklabels=ARMS, ylabel="final val loss (nats/char)", ylim=(1.5, None),
                title="final val loss, each seed a dot")
    axes[1].set(xlabel="step", ylabel="val loss", title="val loss curves (5 seeds per arm)", ylim=(1.5, 3.5))
    axes[1].legend(fontsize=8)
    save(fig, out / "derf.png")


def measure_premise() -> dict[str, list[float]]:
    """precondition.tanh_saturation of each point-wise arm's model at init (built as train.py builds it), per seed,
    on the 128 val windows the runs validate on."""
    import torch

    from experiments.common import reference
    from minillm.training.data import eval_starts

    out = {}
    for a in POINTWISE:
        norm, scaled = a.split("+")[0], a.endswith("+scale")
        cfg = reference.compose("experiment=s8_dyt", "model.init=xavier", f"norm={norm}",
                                *(["model.embed_scale=true"] if scaled else []))
        _, val, vocab = reference.tokens(cfg)
        x, _ = reference.gather(val, eval_starts(len(val), cfg.data.seq_len, cfg.data.val_windows), cfg.data.seq_len)
        values = []
        for seed in SEEDS:
            torch.manual_seed(seed)
            model, _, _ = reference.build(cfg, vocab)
            values.append(pre.tanh_saturation(model.eval(), x))
        out[a] = values
    return out


def main(argv: Sequence[str] | None = None) -> None:
    if "--premise" in (sys.argv[1:] if argv is None else argv):
        PREMISE.write_text(json.dumps(measure_premise(), indent=1) + "\n")
        return
    analysis_main(__doc__, HERE, lambda k: k == VAL_LOSS, analyze, plot, argv, engine=engine)


if __name__ == "__main__":
    main()
