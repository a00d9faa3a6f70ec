"""S7 round 1: the depth ladder, Pre-LN vs Post-LN vs DeepNorm, and the follow-up at L=48."""
