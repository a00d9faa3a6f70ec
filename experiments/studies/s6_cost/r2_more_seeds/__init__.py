"""S6 round 2: quality parity over 10 fresh seed pairs (pre-registered; run by r1_cost's quality.py)."""
