"""What a submitted job leaves behind: the run directory, the registry, Slurm job queries,
attempts, results, the run report."""
