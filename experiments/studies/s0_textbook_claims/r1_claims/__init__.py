"""S0 round 1: three textbook claims about the norms, measured with minillm's modules."""
