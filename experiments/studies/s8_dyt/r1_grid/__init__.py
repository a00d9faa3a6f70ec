"""S8 round 1: DyT's alpha0 x lr grid and two token budgets (pre-registered)."""
