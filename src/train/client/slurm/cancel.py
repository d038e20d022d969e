"""`train cancel`: every queued or running chunk of a chain is cancelled, its event first."""

from __future__ import annotations

import time
from typing import Any

from train.batch import contract
from train.client.slurm import queue
from train.client.slurm.chain import Chain
from train.client.slurm.queue import ACTIVE_STATES
from train.common import _proc

__all__ = ["cancel_chain", "record_cancel"]


def record_cancel(chain: Chain, states: dict[str, dict[str, Any]]) -> list[str]:
    """The chain's queued or running chunks (by `states`), the cancel recorded first where
    there are any, so what the chunks' batch shells record as they die reads as the
    consequence; a chain with nothing left to cancel keeps the record of how it ended."""
    active = [i for i in chain.ids if states.get(i, {}).get("state") in ACTIVE_STATES]
    if active:
        with open(chain.run_dir / contract.CHAIN_EVENTS, "a", encoding="utf-8") as fh:
            fh.write(f"{int(time.time())} 0 {chain.ids[0]} {contract.EV_CANCELLED} "
                     "by-user\n")
    return active


def cancel_chain(chain: Chain) -> list[str]:
    """Cancel every queued or running chunk (record_cancel)."""
    active = record_cancel(chain, queue.job_states(chain.ids))
    if active:
        _proc.run(["scancel", *active], timeout=60)
    return active
