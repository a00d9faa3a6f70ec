"""S7 round 4: the confirmation on fresh seeds, DeepNorm's two parts apart (pre-registered)."""
