"""S3 round 3 (pre-registered): attention entropy collapse with and without QK-norm in S3's high-lr
runs. Round 1 saw attention logits past 1e4 without QK-norm and no divergence; Zhai et al. 2023 name the entropy
collapse of attention (each query's weights on one key) as what large logits do and what destabilizes training,
and QK-norm as what bounds it. Round 1 did not log the entropy. The rules below are committed before any run; the
data commit cites this one.

Needs, before the run, a metric minillm's main branch does not log yet: the attention entropy per layer, min over
heads, at the probe steps, expected as ``layer/<i>/attn_entropy_min`` (nats; each head's -sum_s p_ts log p_ts over
the keys s <= t, averaged over queries and probe sequences), the name it has on the branch that adds it. The
analysis stops when a run lacks it.

Setting: configs/experiment/s3_lr_sensitivity.yaml (dim 64, 4 layers, 400 steps, probes every 10 steps), z-loss 0,
norm {layernorm, rmsnorm} x QK-norm {none, layernorm} x lr {3e-2, 1e-1, 3e-1} (round 1's three highest) x seeds
{0, 1, 2}: 36 runs.

    python train.py -m experiment=s3_lr_sensitivity module.z_loss=0 optimizer.lr=3e-2,1e-1,3e-1 seed=0,1,2 \\
        hydra/launcher=joblib hydra.launcher.n_jobs=2 hydra.sweep.dir=logs/s3_lr_sensitivity/multiruns/entropy
    python -m experiments.studies.s3_lr_sensitivity.r3_attn_entropy.analyze logs/s3_lr_sensitivity/multiruns/entropy

Compute estimate (2-core CPU, two runs side by side; round 1's ~20 s a run, plus the entropy probe): 18 pairs of
~25-30 s, ~10 min.

Measures per run: final min entropy = the smallest layer/<i>/attn_entropy_min over the layers at the last probe step;
max attention logit (summary.json's max_attn_logit); the final val loss.
Precondition (fixed before the runs; QK-norm's problem): attention logits grow without QK-norm: at lr 3e-1, the
seed-mean max attention logit without QK-norm / with it >= LOGIT_GROWTH (round 1's 10x), per norm, reported. E1 and
E2 of a norm read "premise absent at this scale" where it is absent.
Hypotheses (seeds paired; each read with its 95% interval, precondition.parts, Holm across the four parts):
  E1 (collapse without QK-norm, per norm): at lr 3e-1 without QK-norm, the final min entropy at most COLLAPSE nats.
  E2 (QK-norm prevents it, per norm): at lr 3e-1, final min entropy with QK-norm / without at least KEEPS (log
     scale, paired by seed).
  Reported, not tested: final min entropy and val loss per run at every lr (does collapse go with a worse loss?).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, analysis_main, mean, table
from minillm.metrics import parse_metric
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
LRS, TOP_LR, SEEDS, NORMS = (3e-2, 1e-1, 3e-1), 3e-1, (0, 1, 2), ("layernorm", "rmsnorm")
COLLAPSE = 0.5  # nats: a layer whose heads put nearly all of each query's weight on one key (log 64 = 4.2 at most)
KEEPS = 2.0  # QK-norm's final min entropy at least twice the one without
LOGIT_GROWTH = 10.0


def entropy_layer(key: str) -> int | None:
    parsed = parse_metric(key)
    return int(parsed[1]) if parsed and parsed[0] == "layer" and parsed[2] == "attn_entropy_min" else None


def final_min_entropy(run: dict) -> float | None:
    last = [pts[-1][1] for k, pts in run["curves"].items() if entropy_layer(k) is not None and pts]
    return min(last) if last else None


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = Runs(r for r in runs if not r.get("z_loss"))
    prereg.require(runs, "layer/<i>/attn_entropy_min", lambda r: final_min_entropy(r) is not None)

    def of(norm: str, qk: bool, lr: float) -> list[dict]:
        return [r for r in runs if r["norm"] == norm and (r["qk_norm"] != "none") == qk and math.isclose(r["lr"], lr)]

    ent = {(n, qk, lr): prereg.by_seed(of(n, qk, lr), final_min_entropy) for n in NORMS for qk in (False, True)
           for lr in LRS}
    logit = {n: [mean(r.get("max_attn_logit") for r in of(n, qk, TOP_LR)) for qk in (False, True)] for n in NORMS}
    growth = {n: (a / b if a is not None and b else math.nan) for n, (a, b) in logit.items()}
    gate = pre.reported("attention logits grow without QK-norm (QK-norm's problem; Wortsman et al. 2023)",
                        f"max attention logit without QK-norm / with it at lr {TOP_LR:g}, seed means",
                        f"at least {LOGIT_GROWTH:g}", {n: round(g, 3) for n, g in growth.items()},
                        "mixed", "this round's runs")
    for n, g in growth.items():  # one status per norm
        gate["cells"][n]["status"] = "present" if g >= LOGIT_GROWTH else "absent"
    gate["status"] = pre.overall(c["status"] for c in gate["cells"].values())
    spec = {}
    for n in NORMS:
        spec[f"E1 {n}"] = (list(ent[n, False, TOP_LR].values()), COLLAPSE, "at most")
        spec[f"E2 {n}"] = (prereg.ratios(ent[n, True, TOP_LR], ent[n, False, TOP_LR]), KEEPS, "at least", True)
    parts = pre.parts(spec)
    verdicts = {}
    for name in spec:
        w, why = prereg.verdict_line(name, parts["parts"][name], "final min attention entropy" if name[1] == "1"
                                     else "with / without QK-norm, final min attention entropy")
        verdicts[name] = (pre.gate(w, pre.cell(gate, name.split()[1])), why)
    rows = [[n, "qk-LN" if qk else "none", lr, mean(ent[n, qk, lr].values()),
             mean(final_loss(r) for r in of(n, qk, lr))] for n in NORMS for qk in (False, True) for lr in LRS]
    tab = table(["norm", "QK-norm", "lr", "final min attention entropy", "val loss"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = f"{tab}\n\n{pre.line(gate)}\n\n### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n"
    return {"entropy": {f"{n}/{'qk' if qk else 'none'}/{lr:g}": v for (n, qk, lr), v in ent.items()},
            "verdicts": verdicts, "precondition": [gate], "holm": parts}, md


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: entropy_layer(k) is not None, analyze, None, argv)


if __name__ == "__main__":
    main()
