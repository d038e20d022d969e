"""The SLURM job step as `train launch` sees it: the node list (Slurm's compressed lists,
`gpu[01-03,07],login5`, expanded by python-hostlist where it is installed, else here with
the standard library), this task's place in it, the rendezvous (first node as master, a
port from the job id) and what each launch mode hands the program."""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from train.common import _proc
from train.common.errors import UsageError

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

    @property
    def master(self) -> str:
        return self.nodes[0]

    @property
    def port(self) -> int:
        return 20000 + self.job_id % 20000


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
