"""torch's launcher in this process (--mode torchrun): the walltime signal passed on to
its workers, and a failed worker told as the program's failure."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from train.batch.contract import (
    READY_RANK_SUFFIX,
    SIGNAL_READY_VAR,
    STOP_SIGNAL_VAR,
    rank_ready_path,
)
from train.batch.records import signal_name
from train.common.secrets.commands import masked_argv
from train.node.launcher.step import SlurmStep, torchrun_argv

log = logging.getLogger("train.node.launch")


# torch's launcher gives every worker the agent's environment and its own RANK: this
# exec wrapper (the agent's Python, standard library only) turns the signal-readiness file
# into the worker's own before the program starts
_WORKER_READY = (
    "import os, re, sys\n"
    f"v = os.environ.get({SIGNAL_READY_VAR!r})\n"
    "if v:\n"
    f"    os.environ[{SIGNAL_READY_VAR!r}] = re.sub({re.escape(READY_RANK_SUFFIX) + '[0-9]+$'!r}"
    f", '', v) + {READY_RANK_SUFFIX!r} + os.environ.get('RANK', '0')\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n")


def ready_per_rank(mode: str, procid: int, command: Sequence[str],
                   env: MutableMapping[str, str]) -> list[str]:
    """Each rank's own signal-readiness file (the batch shell waits for all of them before
    it passes the walltime signal on): this task's where it is the rank (tasks, single),
    each worker's through an exec wrapper under torchrun. Returns the command to run."""
    value = env.get(SIGNAL_READY_VAR)
    if not value:
        return list(command)
    if mode != "torchrun":
        env[SIGNAL_READY_VAR] = rank_ready_path(value, procid)
        return list(command)
    run = list(command)
    if len(run) > 2 and run[0] in ("python", "python3") and run[1] == "-m":
        run[0] = sys.executable  # what torchrun itself would have run `-m` with
    return [sys.executable, "-c", _WORKER_READY, *run]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def stop_signal_for_workers(env: Mapping[str, str]) -> int:
    """The signal the workers get when the walltime USR1 reaches the agent: the job's."""
    name = env.get(STOP_SIGNAL_VAR, "USR1")
    return signal.SIGTERM if name == "TERM" else signal.SIGUSR1


def _forward_to_workers(signum: int, frame: object) -> None:
    """The walltime signal reaches this agent (srun forwards it as USR1): pass the job's
    stop signal to the workers, which checkpoint and exit 0; the agent then returns when
    they are done."""
    sig = stop_signal_for_workers(os.environ)
    for pid in _children(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def worker_failure(exc: Any, node: str, stop_signal: int) -> int:
    """torchrun's report of failed workers (ChildFailedError), told as the program's
    failure: the first failing rank, its exit code or signal and, where the worker wrote
    torch's error file (@record), its exception. Returns the exit code for this launch:
    the worker's own, or 128 + N for a worker killed by signal N."""
    rank, failure = exc.get_first_failure()
    others = len(exc.failures) - 1
    also = f" ({others} more worker(s) failed after it)" if others else ""
    exitcode = int(failure.exitcode)
    if exitcode < 0:
        signum = -exitcode
        code = 128 + signum
        name = signal_name(signum)
        log.error("worker rank %s (local rank %s, pid %s) on %s was killed by %s (exit "
                  "code %d)%s", rank, failure.local_rank, failure.pid, node, name, code, also)
        if signum == stop_signal:
            log.error("the stop signal %s reached a worker that has no handler for it: "
                      "the program must catch it, save and exit 0", name.removeprefix("SIG"))
        return code
    code = exitcode if 0 < exitcode < 256 else 1
    log.error("worker rank %s (local rank %s, pid %s) on %s exited with code %d%s", rank,
              failure.local_rank, failure.pid, node, exitcode, also)
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    message = data.get("message")
    if isinstance(message, dict):
        message = message.get("message")
    if isinstance(message, str) and message and failure.error_file != "<N/A>":
        log.error("its exception (torch's error file): %s", message)
    else:
        log.error("its own traceback, if it raised, is above in this log")
    return code


def run_torchrun(step: SlurmStep, master: str, nproc: int, command: Sequence[str],
                 env: MutableMapping[str, str], cleanup: Callable[[], None]) -> int:
    """Run torch's launcher for this node's workers: 0 when they are done, 128 + N when
    the agent was stopped by signal N, a failed worker's exit code. `cleanup` runs once
    the launcher has returned (the GPU watch, the stand-in)."""
    import shutil
    import tempfile

    signal.signal(signal.SIGUSR1, _forward_to_workers)
    agent_dir = tempfile.mkdtemp(prefix=".train-torchrun-")  # the workers' error files
    argv = torchrun_argv(step, master, nproc, command, agent_dir)
    log.info("node %d/%d: torchrun %s", step.node_id, len(step.nodes),
             " ".join(masked_argv(argv)))
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except SignalException as exc:  # scancel, preemption: the workers were stopped
        log.warning("torchrun's agent received %s and stopped its workers (they "
                    "checkpoint on it)", exc.sigval.name)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:  # the program failed, not this launcher
        return worker_failure(exc, step.nodes[step.node_id], stop_signal_for_workers(env))
    finally:
        cleanup()
        shutil.rmtree(agent_dir, ignore_errors=True)
    return 0
