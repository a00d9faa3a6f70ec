"""S10 round 1: Mix-LN vs Pre-LN and Post-LN at depth (pre-registered)."""
