"""The studies: one package per study (sNN_name/, its README.md giving every round), one subpackage per round
(rK_name/: its scripts, its committed data and results, its finding.json). Found by experiments.common.layout."""
