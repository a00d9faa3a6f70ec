"""Analysis: reading finished runs, the sweep report, the comparison engine with its rules and statistics,
pre-registered plans and the branch report. Plain Python, numpy, scipy and matplotlib: it imports neither torch
nor Lightning, so a sweep is analysed where it was copied to."""
