"""Resumable GPU training entrypoint and SLURM/Apptainer tooling for university clusters."""

__version__ = "0.1.0"
