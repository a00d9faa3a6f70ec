"""Re-score committed CPU studies with the corrected unigram loss: that of the validated targets.

The studies' runs.jsonl were recorded when ``summary.json``'s ``unigram_loss`` was the cross entropy of the
*whole* val split (3.2772 for Shakespeare, char), while ``val/loss`` averaged over the 128 evenly spaced val
windows that ``configs/experiment/cpu_study.yaml`` validates on. A run's ``failed`` (final val loss >= unigram
loss) and ``stalled`` compared numbers taken over different tokens. The datamodule now computes the unigram
loss over the validated targets; this script gives the committed runs that value, keeping the old one as
``unigram_loss_split``, so each study's analysis re-scores them by the same rule as new runs:

    python -m experiments.common.rescore            # rewrites the runs.jsonl below, once
    python -m experiments.studies.s2_warmup.r1_grid.analyze         # and every study's analysis again

Nothing else in a record changes (the losses are the runs' own); a file already re-scored is left as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.layout import ROOT, STUDIES
from minillm.training.data import TextDataModule

# the rounds recorded before the correction (every later round records the validated targets' unigram loss)
RESCORED = ["s2_warmup/r1_grid", "s3_lr_sensitivity/r1_grid", "s4_batchnorm/r1_grid", "s5_precision/r1_precision",
            "s7_depth/r1_ladder", "s7_depth/r2_output_change", "s7_depth/r3_warmup"]
WHOLE_SPLIT = 3.2771702797102744  # the recorded value: Shakespeare, char, val_fraction 0.1, every val token
VAL_WINDOWS = 128  # configs/experiment/cpu_study.yaml, the base of every study above


def validated_unigram_loss(seq_len: int, val_windows: int = VAL_WINDOWS) -> float:
    dm = TextDataModule(seq_len=seq_len, batch_size=1, val_windows=val_windows)
    dm.prepare_data()
    dm.setup("fit")
    return dm.unigram_loss


def rescore(path: Path) -> int:
    """Rewrite ``path`` with the validated targets' unigram loss; the number of records changed."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    todo = [r for r in records if "unigram_loss_split" not in r]
    if any(r["unigram_loss"] != WHOLE_SPLIT or r["vocab_size"] != 88 for r in todo):
        raise SystemExit(f"{path}: a record is not a default-corpus char run; not re-scored")
    values = {seq_len: validated_unigram_loss(seq_len) for seq_len in {r["seq_len"] for r in todo}}
    for r in todo:
        r["unigram_loss_split"], r["unigram_loss"] = r["unigram_loss"], values[r["seq_len"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return len(todo)


def main() -> None:
    for study in RESCORED:
        path = STUDIES / study / "runs.jsonl"
        print(f"{path.relative_to(ROOT)}: {rescore(path)} records re-scored")


if __name__ == "__main__":
    main()
