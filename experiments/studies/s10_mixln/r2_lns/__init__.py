"""S10 round 2: LayerNorm Scaling vs Pre-LN and Mix-LN (pre-registered)."""
