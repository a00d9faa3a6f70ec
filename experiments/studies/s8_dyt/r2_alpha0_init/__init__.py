"""S8 round 2: smaller alpha0, and unit-scale embeddings (pre-registered)."""
