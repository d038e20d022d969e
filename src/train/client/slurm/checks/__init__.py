"""The login node's checks before a job is queued (train.client.slurm.submitcheck runs
them), one module per family."""
