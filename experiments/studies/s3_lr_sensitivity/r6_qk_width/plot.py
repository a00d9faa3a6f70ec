"""S3 round 6's figure, from the committed runs: the final val loss against the lr for each width without and with
QK-norm (a dot per seed, the line through the seed means, the unigram loss dotted), and the lr sensitivity against
the width (a dot per seed, the line through the seed means) for both. Drawn apart from the pre-registered analysis,
whose file stays as it was committed before the runs.

    python -m experiments.studies.s3_lr_sensitivity.r6_qk_width.plot     # writes qk_width.png here
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.common.study import mean
from experiments.studies.s3_lr_sensitivity.r4_width_transfer.plot import loss_panel
from experiments.studies.s3_lr_sensitivity.r6_qk_width.analyze import LRS, QK, SEEDS, WIDTHS

HERE = Path(__file__).parent


def main() -> Path:
    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    sens = json.loads((HERE / "results.json").read_text())["sensitivity"]
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, qk in zip(axes[:2], QK, strict=True):
        loss_panel(ax, [r for r in runs if r["qk_norm"] == qk], LRS, f"RMSNorm, QK-norm {qk}")
    right = axes[2]
    for color, qk in zip(("C3", "C0"), QK, strict=True):
        per_width = [[sens[f"{w}/{qk}"][str(s)] for s in SEEDS if str(s) in sens[f"{w}/{qk}"]] for w in WIDTHS]
        for w, vals in zip(WIDTHS, per_width, strict=True):
            right.scatter([w] * len(vals), vals, color=color, s=12, alpha=0.6)
        right.plot(WIDTHS, [mean(v) if v else None for v in per_width], color=color, label=f"QK-norm {qk}")
    right.set(xscale="log", xlabel="width (model.dim)", ylabel="lr sensitivity (nats, per seed)",
              title="does QK-norm's benefit grow with width?")
    right.set_xticks(WIDTHS, [str(w) for w in WIDTHS])
    right.minorticks_off()
    right.legend(fontsize=7)
    out = HERE / "qk_width.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
