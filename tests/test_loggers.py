"""minillm/loggers.py: the CSV log that survives several writers (resumes, DDP's fork launcher)."""

from __future__ import annotations

import csv

from minillm.loggers import AppendingCSVLogger


def rows(folder) -> tuple[list[str], list[dict]]:
    with open(folder / "csv" / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_a_second_writer_appends_and_widens_the_header_instead_of_failing_or_erasing(tmp_path):
    """As a resumed run, or the test pass of a DDP run whose fit logged in other processes: a new logger on the
    same folder keeps what is there (Lightning's deletes it, or fails with 'dict contains fields not in
    fieldnames' when another writer added columns)."""
    first = AppendingCSVLogger(tmp_path, name="csv", version="")
    first.log_metrics({"train/loss": 2.0}, step=0)
    first.log_metrics({"train/loss": 1.5, "stab/grad_norm": 3.0}, step=1)
    first.save()
    second = AppendingCSVLogger(tmp_path, name="csv", version="")  # knows nothing of the first one's columns
    second.log_metrics({"test/loss": 1.4}, step=2)
    second.save()
    first.log_metrics({"val/loss": 1.6}, step=1)  # the first writer again, after the second widened the file
    first.save()
    header, got = rows(tmp_path)
    assert set(header) == {"step", "train/loss", "stab/grad_norm", "test/loss", "val/loss"}
    assert [(r["step"], r["train/loss"], r["test/loss"], r["val/loss"]) for r in got] == [
        ("0", "2.0", "", ""), ("1", "1.5", "", ""), ("2", "", "1.4", ""), ("1", "", "", "1.6")]


def test_resume_at_drops_the_rows_a_resumed_run_logs_again(tmp_path):
    logger = AppendingCSVLogger(tmp_path, name="csv", version="")
    for step in range(6):
        logger.log_metrics({"train/loss": 5.0 - step}, step=step)
    logger.save()
    AppendingCSVLogger(tmp_path, name="csv", version="").resume_at(4)  # the checkpoint was saved after 4 steps
    assert [r["step"] for r in rows(tmp_path)[1]] == ["0", "1", "2", "3"]
