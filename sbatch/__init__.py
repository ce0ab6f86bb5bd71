"""Example job specs, each beside the sbatch script it renders to (see hpcsuite.submit.golden)."""
