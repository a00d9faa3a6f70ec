"""S4: BatchNorm vs LayerNorm vs RMSNorm at batch 4 and 64 (README.md)."""
