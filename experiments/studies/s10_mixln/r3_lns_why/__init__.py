"""S10 round 3: why LayerNorm Scaling loses here (pre-registered)."""
