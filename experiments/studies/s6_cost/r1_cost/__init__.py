"""S6 round 1: op-level and end-to-end cost of RMSNorm vs LayerNorm, quality over 2 seed pairs."""
