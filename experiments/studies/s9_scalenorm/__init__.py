"""S9: ScaleNorm and warmup-free Pre-LN (Nguyen & Salazar 2019) (README.md)."""
