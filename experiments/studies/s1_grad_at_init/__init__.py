"""S1: gradients at initialization by depth, Pre-LN vs Post-LN (README.md)."""
