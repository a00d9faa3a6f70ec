"""S2: does Post-LN need warmup where Pre-LN does not? (README.md)."""
