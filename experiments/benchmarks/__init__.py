"""The benchmarks: measurements of minillm itself (correctness against reference loops, speed, cost, the GPU plan),
one package each, with its README.md, results and finding.json. Found by experiments.common.layout."""
