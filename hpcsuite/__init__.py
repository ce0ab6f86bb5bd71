"""hpcsuite: Slurm sbatch templating and Horovod data-parallel training."""

__version__ = "0.1.0"
