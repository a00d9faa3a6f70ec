"""minillm's studies: ``experiments.common`` (study runner, plots, machine description, reference loop) and one
package per study, each run from the repository root as ``python -m experiments.<study>.<script>``."""
