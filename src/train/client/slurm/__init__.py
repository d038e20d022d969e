"""SLURM side: job specs, sbatch rendering, chained submission, status, logs, cancel."""
