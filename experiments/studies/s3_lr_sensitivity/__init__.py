"""S3: LR sensitivity of norm variants; attention-logit growth, QK-norm, z-loss (README.md)."""
