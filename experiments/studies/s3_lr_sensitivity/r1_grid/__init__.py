"""S3 round 1: LR sensitivity of norm x QK-norm x z-loss."""
