"""S0: three textbook claims about BatchNorm, LayerNorm and RMSNorm, measured with minillm's own modules (README.md)."""
