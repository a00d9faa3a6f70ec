"""S10: Mix-LN (Li et al. 2024): per-layer gradient norms and layer-drop importance, Pre vs Post vs Mix (README.md)."""
