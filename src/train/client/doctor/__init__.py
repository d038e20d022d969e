"""`train doctor`: what happened to each chunk of a run, the cause with its evidence (log
file and line), and the fix as the flags to change.

It reads what the chain left: its record (chain.json), events (chain.events), the job
logs, Slurm's state and exit code of each job (squeue, then sacct, or the job completion
log where there is no accounting: `job_states`), the run's status.json and the GPU
utilisation samples. Logs are streamed, never read whole (logread), so a gigabyte of log
costs about a second and flat memory.

Each cause is one rule (logread.RULES, LogRule for log messages; the Slurm-state and event
rules in chunks.py). A run with no finding is healthy (exit 0); any finding is exit 1.
"""
