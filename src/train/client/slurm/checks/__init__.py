"""The login node's checks before a job is queued (train.client.slurm.submitcheck runs them),
one module per family: the program and data (files), --python (python), the image
(image), a launcher in the command (workload), the run folder (rundir), Slurm's answer on
the resources (resources) and sbatch's own variables (sbatchenv)."""
