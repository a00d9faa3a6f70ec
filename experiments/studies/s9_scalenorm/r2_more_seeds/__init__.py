"""S9 round 2: ScaleNorm vs LayerNorm over 16 seeds at one cell (pre-registered)."""
