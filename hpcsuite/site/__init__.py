"""The machine hpcsuite runs on: the local Slurm cluster and the doctor's checks."""
