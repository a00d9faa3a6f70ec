"""S5: fp16 overflow in norms and activation growth per placement and precision (README.md)."""
