"""S2 round 2: the key cells in Xiong et al.'s Xavier init (pre-registered)."""
