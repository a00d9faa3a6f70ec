"""Throughput: minillm vs the reference loop, per-norm cost end to end, data-loading wait (README.md)."""
