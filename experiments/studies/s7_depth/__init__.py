"""S7: depth ladder, Pre-LN vs Post-LN vs DeepNorm (README.md)."""
