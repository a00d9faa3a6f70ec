"""S4 round 3's figure, from the committed runs: each run's final val loss per norm at batch 4 and 64 (a failed run in
red, clipped to the axis), with the unigram loss. Drawn apart from the pre-registered analysis, whose file stays as
it was committed before the runs.

    python -m experiments.studies.s4_batchnorm.r3_powernorm_nogroup.plot     # writes powernorm.png here
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.studies.s4_batchnorm.r3_powernorm_nogroup.analyze import ARMS, arm
from minillm.outcome import failed_of, final_loss

HERE = Path(__file__).parent
TOP = 4.0  # nats: a diverged BatchNorm run is drawn here


def main(folder: Path = HERE, note: str = "") -> Path:
    """powernorm.png in ``folder`` from its runs.jsonl (round 4 draws its own the same way); ``note`` ends each
    panel's title."""
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines() if line.strip()]
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, batch in zip(axes, (4, 64), strict=True):
        for i, name in enumerate(ARMS):
            cell = [r for r in runs if arm(r) == name and r.get("batch_size") == batch]
            for r in cell:
                loss = final_loss(r)
                ax.scatter(i, min(loss, TOP) if loss is not None else TOP, s=16,
                           color="C3" if failed_of(r) else "C0")
        unigram = [r["unigram_loss"] for r in runs if r.get("unigram_loss")]
        if unigram:
            ax.axhline(sum(unigram) / len(unigram), color="grey", ls=":", lw=0.8, label="unigram loss")
        ax.set(xticks=range(len(ARMS)), xticklabels=["BatchNorm", "LayerNorm", "PN (no group\nscaling)", "PN-G"],
               title=f"batch {batch}{note}", ylim=(1.7, TOP + 0.1))
    axes[0].set_ylabel(f"final val loss (nats; red: failed; above {TOP:g} drawn at {TOP:g})")
    axes[0].legend(fontsize=8)
    out = folder / "powernorm.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
