"""S6: RMSNorm vs LayerNorm, op-level and end-to-end cost, quality parity (README.md)."""
