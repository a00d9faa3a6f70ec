"""S3 round 2: OLMo 2's norms in the LR sweep (pre-registered)."""
