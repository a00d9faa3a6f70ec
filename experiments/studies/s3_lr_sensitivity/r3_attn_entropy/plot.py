"""S3 round 3's figure, from the committed runs: each run's final min attention entropy and val loss against the lr,
per norm, with and without QK-norm (a dot per seed, the line through the seed means). Drawn apart from the
pre-registered analysis, whose file stays as it was committed before the runs.

    python -m experiments.studies.s3_lr_sensitivity.r3_attn_entropy.plot     # writes entropy.png here
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.common.study import mean
from experiments.studies.s3_lr_sensitivity.r3_attn_entropy.analyze import LRS, NORMS
from minillm.outcome import final_loss

HERE = Path(__file__).parent


def main() -> Path:
    entropy = json.loads((HERE / "results.json").read_text())["entropy"]
    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for color, norm in zip(("C0", "C3"), NORMS, strict=True):
        for qk, style in ((False, "--"), (True, "-")):
            label = f"{norm}, {'QK-norm' if qk else 'no QK-norm'}"
            per_lr = [entropy[f"{norm}/{'qk' if qk else 'none'}/{lr:g}"] for lr in LRS]
            for lr, seeds in zip(LRS, per_lr, strict=True):  # log scale: a collapse to ~0 drawn at 1e-8
                left.scatter([lr] * len(seeds), [max(v, 1e-8) for v in seeds.values()], color=color, s=12, alpha=0.6)
            left.plot(LRS, [max(mean(s.values()), 1e-8) for s in per_lr], style, color=color, label=label)
            losses = [[final_loss(r) for r in runs if r["norm"] == norm and (r["qk_norm"] != "none") == qk
                       and math.isclose(r["lr"], lr) and not r.get("z_loss")] for lr in LRS]
            for lr, vals in zip(LRS, losses, strict=True):
                right.scatter([lr] * len(vals), vals, color=color, s=12, alpha=0.6)
            right.plot(LRS, [mean(v) for v in losses], style, color=color, label=label)
    left.axhline(0.5, color="grey", lw=0.8, ls=":", label="E1's collapse line (0.5 nats)")
    left.set(xscale="log", yscale="log", xlabel="lr", ylabel="final min attention entropy (nats)",
             title="sharpest head, smallest over layers")
    right.set(xscale="log", xlabel="lr", ylabel="final val loss (nats)", title="what it cost")
    for ax in (left, right):
        ax.set_xticks(LRS, [f"{lr:g}" for lr in LRS])
        ax.minorticks_off()
    left.legend(fontsize=7)
    out = HERE / "entropy.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
