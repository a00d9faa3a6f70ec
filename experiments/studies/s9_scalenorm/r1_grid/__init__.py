"""S9 round 1: ScaleNorm vs LayerNorm, with and without warmup (pre-registered)."""
