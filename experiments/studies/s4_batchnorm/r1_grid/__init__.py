"""S4 round 1: BatchNorm vs LayerNorm vs RMSNorm at batch 4 and 64."""
