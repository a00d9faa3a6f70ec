"""S4 round 2: PowerNorm, and BatchNorm's fluctuation against the sampling null (pre-registered)."""
