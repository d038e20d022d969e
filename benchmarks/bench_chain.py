"""From a chunk's death to the chain's final state with nothing of it left in the queue, per
kind of death, on the local SLURM cluster. Goal: at most 2 x KillWait + one scheduling
interval (sched_interval) after Slurm recorded the death.

The deaths are the slurm tier's own scenarios (tests/integration/chains.py): a walltime
TIMEOUT of a step that ignores the signal, scancel of the running chunk, SIGKILL of its
step, a node failure (slurmd and the job's processes killed), and a requeue of a running
chunk in requeue mode (there: until it runs again from its checkpoint). The times come
from polling `train status --json` every 0.2 s (each poll itself takes about 0.4 s).

Starts its own cluster with ci/slurm-up.sh (root, slurm-wlm, munge) and stops it after."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))
from tests.integration.chains import DEATHS  # noqa: E402

from _results import local_slurm, machine, short, write_section  # noqa: E402

WHAT = {
    "timeout": "Slurm's TIMEOUT (the job's EndTime)",
    "scancel": "`scancel JOB`",
    "kill-step": "`scancel --signal=KILL JOB.0`",
    "node-failure": "Slurm's NODE_FAIL (EndTime; SlurmdTimeout after the node fell silent)",
    "requeue": "`scontrol requeue JOB` (until it runs again from its checkpoint)",
}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp, local_slurm() as (env, folder):
        conf = (folder / "slurm.conf").read_text()
        kill_wait = int(re.search(r"^KillWait=(\d+)", conf, re.M).group(1))  # type: ignore[union-attr]
        sched = int(re.search(r"sched_interval=(\d+)", conf).group(1))  # type: ignore[union-attr]
        bound = 2 * kill_wait + sched
        # the short mode: one death, the quickest (the timeout waits out a walltime)
        kinds = {"scancel": DEATHS["scancel"]} if short() else DEATHS
        for i, (kind, death_of) in enumerate(kinds.items()):
            work = Path(tmp) / f"d{i}"
            work.mkdir()
            death = death_of(work, env, f"b{i}")
            took = death.settled_at - death.at
            verdict = "yes" if took <= bound else "NO"
            if kind == "requeue":  # not an end: the chain goes on
                verdict = "n/a (the chain goes on)"
            rows.append(f"| {kind} | {WHAT[kind]} | {death.status['state']} | "
                        f"{took:.1f} | {verdict} |")
    body = "\n".join([
        f"## A chunk's death to the chain's final state (goal: <= 2 x KillWait + "
        f"sched_interval = {bound} s)",
        "",
        f"Machine: {machine()}; the local SLURM cluster of ci/slurm-up.sh (Slurm 22.05, "
        f"KillWait={kill_wait}, sched_interval={sched}, no kill_invalid_depend, as at the "
        "sites). One run per kind; seconds from the death to the first `train status` that "
        "shows the final state with no chunk queued or running (polled every 0.2 s).",
        "",
        "| death | measured from | final state | seconds | within goal |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "A requeued chunk is no end: the time shown runs until the job trains again from its "
        "checkpoint (Slurm holds a requeued job back for a few seconds, then the trainer "
        "starts: Python and torch imports, restore), and its final state is the later "
        "`train cancel`.",
    ])
    write_section("chain", body)


if __name__ == "__main__":
    main()
