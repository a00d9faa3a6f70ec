"""S11: weight decay on the norm gains (README.md)."""
