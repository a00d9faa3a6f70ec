"""S7 round 3: Post-LN at L=48 with a 120-step warmup."""
