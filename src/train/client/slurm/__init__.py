"""SLURM side: job specs, sbatch rendering, chained submission, status, logs, cancel.

A chain is one script run by every chunk. `train submit` renders it and submits chunk 1
held; the chain's record (chain.json, and chain.ids with one line per chunk) is written,
and only then the job is released, so nothing runs before its record exists and a failure
while submitting leaves nothing behind. Each chunk then submits its successor itself
(train.batch.chunk), so the login node can be left and at most two jobs of a chain are
queued.
"""
