"""Scheduler adapters: the only code in gpuops that talks to Slurm or Kubernetes."""
