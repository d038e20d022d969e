"""A user's program that fails the way jobs fail in the field, for `train doctor`'s real
jobs (tests/integration/test_doctor.py). Usage: failing.py MODE [ARG]."""

from __future__ import annotations

import datetime
import os
import resource
import sys


def rendezvous() -> None:
    """Rank 0 of two, started alone (a script run without srun): it waits for the other."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    dist.init_process_group("gloo", rank=0, world_size=2,
                            timeout=datetime.timedelta(seconds=5))


def python_error() -> None:
    config = {"learning_rate": 1e-3}
    print("lr", config["lr"])


def disk(folder: str) -> None:
    """Checkpoints into a small file system until it is full."""
    block = b"\0" * (1 << 16)
    with open(os.path.join(folder, "ckpt.pt"), "wb") as fh:
        while True:
            fh.write(block)
            fh.flush()


def memory() -> None:
    """A replay buffer larger than the memory limit this process was given."""
    limit = 512 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    buffers = [bytearray(64 * 2**20) for _ in range(64)]
    print(len(buffers))


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    {"rendezvous": rendezvous, "python_error": python_error, "disk": disk,
     "memory": memory}[mode](*args)
