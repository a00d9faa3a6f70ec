"""S3 round 7 (pre-registered): do the QK-norm's forms differ in how much they lower the lr sensitivity? OLMo 2
normalizes the flattened q and k projections over all heads (model.qk_norm_axis=flat), ViT-22B and Qwen3 each
head's (head); Henry et al. 2020 ("Query-Key Normalization for Transformers") L2-normalize q and k and learn the
softmax's temperature (model.qk_norm=l2). Round 1 found per-head QK-norm lowering the lr sensitivity 2.4-2.6x at
width 64, round 6 at every width 32-256. Which axis to normalize over is argued in 2025-2026 issues of several
training frameworks; this round measures whether it matters, and whether Henry's form mitigates as well. The rules
below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s3_qk_forms.yaml (S3's: RMSNorm, Pre-LN, dim 64, 4 layers, 4 heads, 400 steps, no
clipping, z-loss 0, the attention-logit probe every 10 steps); arms none (no QK-norm), head (RMSNorm QK-norm per
head, shared gains: the baseline), flat (RMSNorm over the flattened projection, per-head gains: OLMo 2) and l2
(Henry et al.'s L2 with a learned temperature, per head); lr {3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1} (round 1's
grid, which reaches the lrs where attention logits grow); seeds {0, 1, 2}: 84 runs, one commit.

    bash experiments/studies/s3_lr_sensitivity/r7_qk_forms/run.sh        # JOBS=2 on a quiet machine

Compute estimate (round 6's width-64 runs, ~18 s each with two side by side): ~13 min with two processes.

Measures, per arm and seed: the lr sensitivity (minillm.analysis.report.lr_sensitivity: the mean over the grid of
the final val loss minus the grid's best, a failed run at ln V; round 1's measure).
Precondition (the gate; round 1's rule): attention logits grow without QK-norm: the max attention logit over the
grid and seeds of none over head at least LOGIT_GROWTH. Absent: every hypothesis reads "premise absent at this
scale".
Hypotheses (3 seeds, paired by seed, ratios on the log scale, each part read with its 95% interval, Holm across
the five parts):
  R (round 1 replicated with RMS QK-norm per head): sensitivity head / none at most LOWER.
  A (the axis does not matter): flat / head within [1/SAME, SAME] (two parts, at least 1/SAME and at most SAME):
    "confirmed" when both hold, "not at this scale" when either fails, else "unresolved".
  L (Henry's form mitigates too): l2 / none at most LOWER.
  LH (Henry's form as well as per-head RMS): l2 / head at most SAME.
Through the comparison engine (verdicts.json): flat, l2 and none against head at each arm's tuned lr (chosen on
the validation loss the verdict reads: the runs have no held-out test, flagged by the engine) with the stability
verdict (per-seed lr sensitivity, trainable lr range, failure rate over the grid).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, analysis_main, mean, table
from minillm.analysis.compare import compare
from minillm.analysis.report import lr_sensitivity
from minillm.analysis.rules import REGISTERED_V2
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
ARMS, SEEDS = ("none", "head", "flat", "l2"), (0, 1, 2)
LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
LOWER = 0.8  # round 1's: a mitigation lowers the sensitivity when it is at most 0.8x without it
SAME = 1.25  # two forms alike when the ratio of their sensitivities lies within [0.8, 1.25] (1 / LOWER)
LOGIT_GROWTH = 10.0  # round 1's: logits grow without QK-norm when their max is at least 10x the QK-norm one
TAG = "qk_forms"


def arm_of(run: dict) -> str:
    qk = run.get("qk_norm") or "none"
    axis = ((run.get("settings") or {}).get("model") or {}).get("qk_norm_axis", "head")
    return "flat" if qk == "rmsnorm" and axis == "flat" else "head" if qk == "rmsnorm" else qk


def _ours(runs: Runs) -> Runs:
    return Runs(r for r in runs if TAG in (r.get("tags") or []))


def cell(runs: Runs, arm: str, seed: int) -> dict[float, float] | None:
    """lr -> final val loss (failed: ln V) of one arm and seed, None unless the grid is complete."""
    losses = {r["lr"]: loss_for_comparison(r) for r in runs if arm_of(r) == arm and r["seed"] == seed}
    return losses if sorted(losses) == sorted(LRS) else None


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = _ours(runs)
    prereg.require(runs, "the max attention logit (summary max_attn_logit)", lambda r: "max_attn_logit" in r)
    sens = {a: {} for a in ARMS}
    for a in ARMS:
        for s in SEEDS:
            losses = cell(runs, a, s)
            if losses is not None:
                sens[a][s] = lr_sensitivity(losses)

    def top_logit(a: str) -> float:
        return max((r.get("max_attn_logit") or 0.0 for r in runs if arm_of(r) == a), default=0.0)

    growth = top_logit("none") / top_logit("head") if top_logit("head") else None
    status = "not recorded" if growth is None else "present" if growth >= LOGIT_GROWTH else "absent"
    gate = pre.reported("attention logits grow without QK-norm (QK-norm's problem; Wortsman et al. 2023)",
                        "max attention logit over the grid and seeds without QK-norm / with per-head QK-norm",
                        f"at least {LOGIT_GROWTH:g}", {"width 64": growth}, status,
                        "this round's runs (max_attn_logit)")
    ratio = {(a, b): prereg.ratios(sens[a], sens[b]) for a, b in
             (("head", "none"), ("flat", "head"), ("l2", "none"), ("l2", "head"))}
    parts = pre.parts({"R": (ratio["head", "none"], LOWER, "at most", True),
                       "A low": (ratio["flat", "head"], 1 / SAME, "at least", True),
                       "A high": (ratio["flat", "head"], SAME, "at most", True),
                       "L": (ratio["l2", "none"], LOWER, "at most", True),
                       "LH": (ratio["l2", "head"], SAME, "at most", True)})
    verdicts = {}
    for name, text in (("R", "sensitivity head / none"), ("L", "sensitivity l2 / none"),
                       ("LH", "sensitivity l2 / head")):
        w, why = prereg.verdict_line(name, parts["parts"][name], text)
        verdicts[name] = (pre.gate(w, gate), why)
    low, high = (prereg.verdict_line(k, parts["parts"][k], "sensitivity flat / head") for k in ("A low", "A high"))
    words = {low[0], high[0]}
    a_word = ("confirmed" if words == {"confirmed"} else "not at this scale" if "not at this scale" in words
              else "unresolved")
    verdicts["A"] = (pre.gate(a_word, gate), f"{low[1]}; {high[1]}")
    rows = [[a, len(sens[a]), mean(sens[a].values()), " / ".join(f"{v:.3f}" for _, v in sorted(sens[a].items())),
             top_logit(a)] for a in ARMS]
    tab = table(["arm", "seeds", "lr sensitivity (seed mean)", "per seed", "max attention logit"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in sorted(verdicts.items())])
    md = (f"RMSNorm, width 64, lr grid {', '.join(f'{lr:g}' for lr in LRS)}, {len(runs)} runs.\n\n{tab}\n\n"
          f"{pre.line(gate)}\n\n### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n\n"
          f"verdicts.md: minillm.analysis.compare, each form against per-head QK-norm at its tuned lr, with the "
          f"stability verdict.\n")
    return {"sensitivity": sens, "max_attn_logit": {a: top_logit(a) for a in ARMS}, "verdicts": verdicts,
            "precondition": [gate], "holm": parts}, md


def engine(runs: Runs) -> dict:
    """verdicts.json: every form against per-head QK-norm at its tuned lr, with the stability verdict."""
    records = [{**{k: v for k, v in r.items() if k != "curves"}, "arm": arm_of(r)} for r in _ours(runs)]
    return compare(records, "arm", "head", metric="final_val_loss", lr="tuned", stability=True, **REGISTERED_V2)


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: False, analyze, None, argv, engine=engine)


if __name__ == "__main__":
    main()
