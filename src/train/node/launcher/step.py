"""The SLURM job step as `train launch` sees it: the node list (Slurm's compressed lists,
`gpu[01-03,07],login5`, expanded by python-hostlist where it is installed, else here with
the standard library), this task's place in it, the rendezvous (first node as master, the
port the engine picked there, else the job id's) and what each launch mode hands the
program; torch's launcher in this process (--mode torchrun): the walltime signal passed on
to its workers, and a failed worker told as the program's failure."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.batch.contract import (
    MASTER_PORT_VAR,
    READY_RANK_SUFFIX,
    SIGNAL_READY_VAR,
    STOP_SIGNAL_VAR,
    job_port,
    rank_ready_path,
)
from train.batch.saves import signal_name
from train.common import _proc
from train.common.errors import UsageError
from train.common.secrets.commands import masked_argv

log = logging.getLogger("train.node.launch")

# set it where node names do not resolve inside the container
MASTER_ADDR_VAR = "TRAIN_MASTER_ADDR"
# one process in all meets itself here, as under `torchrun --nproc-per-node 1`
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class SlurmStep:
    job_id: int
    nodes: list[str]
    node_id: int
    procid: int
    localid: int
    ntasks: int
    ntasks_per_node: int
    cpus_per_task: int
    gpus_on_node: int
    given_port: int = 0  # the engine's pick (MASTER_PORT_VAR); 0: the job id's own

    @property
    def master(self) -> str:
        return self.nodes[0]

    @property
    def port(self) -> int:
        return self.given_port or job_port(self.job_id)


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None or value == "":
        if default is None:
            raise UsageError(f"environment variable {name} is missing: `train launch` runs "
                             "inside a SLURM job step (srun)")
        return default
    try:
        return int(value.split("(")[0])  # SLURM_TASKS_PER_NODE style "2(x3)"
    except ValueError:
        raise UsageError(f"environment variable {name} must be an integer, got "
                         f"{value!r}") from None


def gpus_visible(env: Mapping[str, str]) -> int:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return _int(env, "SLURM_GPUS_ON_NODE", 0)


def _given_port(env: Mapping[str, str]) -> int:
    """The engine's port (MASTER_PORT_VAR) as it writes it, digits alone; 0 where unset."""
    raw = env.get(MASTER_PORT_VAR, "")
    if raw and not (re.fullmatch(r"[0-9]{1,5}", raw) and 0 < int(raw) < 65536):
        raise UsageError(f"environment variable {MASTER_PORT_VAR}={raw!r} is no port: a "
                         "number 1-65535, or unset for the job id's")
    return int(raw or 0)


def read_step(env: Mapping[str, str]) -> SlurmStep:
    """The job step as SLURM describes it; inconsistencies are errors naming the variable."""
    raw = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not raw:
        raise UsageError("environment variable SLURM_JOB_NODELIST is missing: `train launch` "
                         "runs inside a SLURM job step (srun)")
    try:
        nodes = expand_nodes(raw)
    except Exception:
        raise UsageError(f"environment variable SLURM_JOB_NODELIST={raw!r} is not a host "
                         "list") from None
    nnodes = _int(env, "SLURM_NNODES", len(nodes))
    if nnodes != len(nodes):
        raise UsageError(f"environment variable SLURM_NNODES={nnodes} disagrees with "
                         f"SLURM_JOB_NODELIST ({len(nodes)} nodes: {raw})")
    step = SlurmStep(
        job_id=_int(env, "SLURM_JOB_ID"),
        nodes=nodes,
        node_id=_int(env, "SLURM_NODEID"),
        procid=_int(env, "SLURM_PROCID"),
        localid=_int(env, "SLURM_LOCALID", 0),
        ntasks=_int(env, "SLURM_NTASKS", 1),
        ntasks_per_node=_int(env, "SLURM_NTASKS_PER_NODE", 1),
        cpus_per_task=_int(env, "SLURM_CPUS_PER_TASK", os.cpu_count() or 1),
        gpus_on_node=gpus_visible(env),
        given_port=_given_port(env),
    )
    if not 0 <= step.node_id < len(nodes):
        raise UsageError(f"environment variable SLURM_NODEID={step.node_id} is outside "
                         f"0..{len(nodes) - 1}")
    if not 0 <= step.procid < step.ntasks:
        raise UsageError(f"environment variable SLURM_PROCID={step.procid} is outside "
                         f"0..{step.ntasks - 1} (SLURM_NTASKS={step.ntasks})")
    return step


def resolve_address(node: str) -> str:
    """The node's address: DNS first, then what SLURM knows (`scontrol show node`)."""
    try:
        return socket.gethostbyname(node)
    except OSError:
        pass
    try:
        out = _proc.run(["scontrol", "show", "node", node, "-o"], timeout=30).stdout
    except _proc.ProcError:
        out = ""
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    raise UsageError(f"cannot resolve the master node {node!r}: not in DNS and scontrol "
                     "(often missing inside containers) did not give its NodeAddr")


def torchrun_argv(step: SlurmStep, master_addr: str, nproc: int, command: Sequence[str],
                  log_dir: str | None = None) -> list[str]:
    """torch.distributed.run arguments: a static rendezvous on the first node (and the
    folder for the agent's files: without one it leaves a torchelastic_* in $TMPDIR)."""
    argv = [f"--nnodes={len(step.nodes)}", f"--node-rank={step.node_id}",
            f"--nproc-per-node={nproc}", f"--master-addr={master_addr}",
            f"--master-port={step.port}", f"--rdzv-id={step.job_id}"]
    if log_dir is not None:
        argv.append(f"--log-dir={log_dir}")
    if command and command[0] in ("python", "python3", sys.executable) and len(command) > 2 \
            and command[1] == "-m":
        return [*argv, "-m", command[2], *command[3:]]
    return [*argv, "--no-python", *command]


def tasks_env(step: SlurmStep, master_addr: str, port: int | None = None
              ) -> dict[str, str]:
    """What torch's launcher gives a worker, for this task as one rank (the step's port
    unless another is given)."""
    return {"RANK": str(step.procid), "LOCAL_RANK": str(step.localid),
            "WORLD_SIZE": str(step.ntasks), "LOCAL_WORLD_SIZE": str(step.ntasks_per_node),
            "NODE_RANK": str(step.node_id), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(step.port if port is None else port)}


def free_port(address: str) -> int:
    """A port free on `address` now: one process's group (single mode) meets there, and
    the job id's port may be another job's on a shared node."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")


def _expand_one(name: str) -> list[str]:
    match = re.search(r"\[([^\[\]]*)\]", name)
    head = name[:match.start()] if match else name
    if "[" in head or "]" in head:
        raise ValueError(f"unbalanced brackets in {name!r}")
    if match is None:
        return [name]
    tail = name[match.end():]
    out: list[str] = []
    for item in match.group(1).split(","):
        found = _RANGE.match(item.strip())
        if found is None:
            raise ValueError(f"bad range {item!r} in {name!r}")
        low, high = found.group(1), found.group(2) or found.group(1)
        if int(high) < int(low):
            raise ValueError(f"range {item!r} goes down in {name!r}")
        width = len(low)
        for number in range(int(low), int(high) + 1):
            for rest in _expand_one(tail):  # a second bracket later in the name
                out.append(f"{head}{number:0{width}d}{rest}")
    return out


def expand(text: str) -> list[str]:
    """Every node name of a list, in order; ValueError for a malformed one."""
    names: list[str] = []
    for part in re.split(r",(?![^\[]*\])", text.strip()):  # the commas outside brackets
        names += _expand_one(part) if part else []
    return names


def expand_nodes(raw: str) -> list[str]:
    """python-hostlist where it is installed; either raises for a malformed list."""
    try:
        import hostlist
    except ImportError:
        return expand(raw)
    return list(hostlist.expand_hostlist(raw))


# torch's launcher gives every worker the agent's environment and its own RANK: this
# exec wrapper (the agent's Python, standard library only) turns the signal-readiness file
# into the worker's own before the program starts, where the image has no `env`
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
    each worker's under torchrun: `env` sets the task's file with the worker's local rank,
    which torch's launcher writes for its `${local_rank}` in a worker's arguments (no
    second Python starting before each worker). Returns the command to run: under
    torchrun, as torch's launcher is to be given it (it substitutes every worker argument
    as a string.Template, `$$` to `$`: the program's own `$` passed as `$$` reaches it as
    written, as in the other modes)."""
    value = env.get(SIGNAL_READY_VAR)
    if mode != "torchrun":
        if value:
            env[SIGNAL_READY_VAR] = rank_ready_path(value, procid)
        return list(command)
    run = [arg.replace("$", "$$") for arg in command]
    if not value:
        return run
    if len(run) > 2 and run[0] in ("python", "python3") and run[1] == "-m":
        run[0] = sys.executable  # what torchrun itself would have run `-m` with
    tool = shutil.which("env")
    if tool is None:
        return [sys.executable, "-c", _WORKER_READY, *run]
    path = rank_ready_path(value, procid).replace("$", "$$")
    return [tool, f"{SIGNAL_READY_VAR}={path}-${{local_rank}}", *run]


def stop_signal_for_workers(env: Mapping[str, str]) -> int:
    """The signal the workers get when the walltime USR1 reaches the agent: the job's."""
    name = env.get(STOP_SIGNAL_VAR, "USR1")
    return signal.SIGTERM if name == "TERM" else signal.SIGUSR1


def _stopped_workers_save(sig: int, env: Mapping[str, str]) -> str:
    """Whether the workers the agent stopped with `sig` save on it: only where it is the
    stop signal they are told of (stop mode kill tells them none; its TERM only ends them)."""
    name = env.get(STOP_SIGNAL_VAR, "none")
    if name != "none" and stop_signal_for_workers(env) == sig:
        return f"it is their stop signal ({name}): they save on it where they handle it"
    told = "the job gives them no stop signal" if name == "none" else \
        f"their stop signal is {name}"
    return f"{told}: what they saved before it is kept"


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` now or its main thread blocks it
    (SigCgt, SigBlk of /proc/PID/status): a blocked signal cannot kill it, and a program
    that takes it with a signalfd or in a thread's sigwait blocks it and has no handler (a
    thread in sigwait shows it unblocked while it waits: the main thread's mask says it);
    True where that cannot be read."""
    try:
        masks = [int(line.split()[1], 16) for line in
                 Path(f"/proc/{pid}/status").read_text().splitlines()
                 if line.startswith(("SigCgt:", "SigBlk:"))]
    except (OSError, ValueError, IndexError):
        return True
    return not masks or any(mask >> (sig - 1) & 1 for mask in masks)


def _forward_to_workers(signum: int, frame: object) -> None:
    """The walltime signal reaches this agent (srun forwards it as USR1): pass the job's
    stop signal to the workers that catch it now, which checkpoint and exit 0; the agent
    then returns when they are done. Slurm signals every process of the step itself
    (proctrack cgroup or linuxproc), Docker's kill only this agent: a worker that got it
    from Slurm and is exiting after its save has no handler any more (Python takes its
    handlers away at exit), and a second signal would kill it (exit 138, a failed chunk)."""
    sig = stop_signal_for_workers(os.environ)
    workers: list[int] = []  # this process's children, over its threads
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        try:
            workers += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    for pid in workers:
        if catches(pid, sig):
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
    except SignalException as exc:  # scancel, preemption, a kill stop
        log.warning("torchrun's agent received %s and stopped its workers (%s)",
                    exc.sigval.name, _stopped_workers_save(exc.sigval, env))
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:  # the program failed, not this launcher
        return worker_failure(exc, step.nodes[step.node_id], stop_signal_for_workers(env))
    finally:
        cleanup()
        shutil.rmtree(agent_dir, ignore_errors=True)
    return 0
