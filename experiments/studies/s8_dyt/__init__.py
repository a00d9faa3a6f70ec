"""S8: DyT (Dynamic Tanh) against RMSNorm: alpha0 x lr and two token budgets (README.md)."""
