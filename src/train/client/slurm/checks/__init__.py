"""The login node's checks before a job is queued (train.client.slurm.submitcheck runs them),
one module per family: the program and data (files), the Pythons the job runs with
(python), the image (imagefit), a command's traps and launchers (traps), the run folder
(rundir), Slurm's answer on the resources (resources) and sbatch's own variables
(sbatchenv)."""
