"""SLURM side: job specs, sbatch rendering, chained submission, status, logs, cancel.

A chain is one script run by every chunk. `train submit` renders it and submits chunk 1
held; the chain's record (chain.json, and chain.ids with one line per chunk) is written,
and only then the job is released, so nothing runs before its record exists and a failure
while submitting leaves nothing behind. Each chunk then submits its successor itself (see
job-lib.sh), so the login node can be left and at most two jobs of a chain are queued.

By concern: `queue` asks Slurm about jobs (and parses its output), `chain` reads a chain's
record and finds runs, `submission` submits a chain, `chainstatus` says what state a
chain is in, and `cancel` cancels it.
"""
