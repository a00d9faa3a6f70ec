"""S1 round 1: the last layer's gradient at init against depth, in three inits (round 2 added xavier here)."""
