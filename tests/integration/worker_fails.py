"""A worker that fails as programs do, for torch's launcher (no `train` import).

WORKER_FAIL=raise: the last rank raises RuntimeError("worker boom at rank N").
WORKER_FAIL=exit: the last rank exits with code 7 after a line on stderr.
Anything else: every rank prints and exits 0.
"""

import os
import sys

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print(f"worker rank {rank}/{world} started", flush=True)
mode = os.environ.get("WORKER_FAIL", "")
if rank == world - 1 and mode == "raise":
    raise RuntimeError(f"worker boom at rank {rank}")
if rank == world - 1 and mode == "exit":
    print(f"worker rank {rank} gives up", file=sys.stderr, flush=True)
    sys.exit(7)
if rank == world - 1 and mode == "usr1":  # as if the stop signal came: no handler here
    import signal

    os.kill(os.getpid(), signal.SIGUSR1)
