"""SLURM side: job specs, sbatch rendering, chained submission, status, logs, cancel.

A chain is one script run by every chunk; each chunk submits its successor itself
(train.batch.chunk), so the login node can be left and at most two jobs of a chain are
queued. How `train submit` starts one, and leaves nothing behind where it fails:
train.client.slurm.submission.
"""
