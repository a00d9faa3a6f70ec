"""S5 round 2: the Peri-LN growth test over depth, lr tuned per placement (pre-registered)."""
