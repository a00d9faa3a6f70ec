"""minillm's studies and benchmarks: ``experiments.studies.<sNN_name>.<rK_name>`` (a study's rounds),
``experiments.benchmarks.<name>`` and ``experiments.common`` (study runner, layout, plots, machine description,
reference loop). Every script runs from the repository root as ``python -m experiments.<...>.<script>``."""
