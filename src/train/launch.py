"""`train launch`: runs inside the container on every node of a SLURM job step.

It reads the SLURM environment (the node list through the `hostlist` library), derives the
rendezvous (first node as master, a port from the job id, the job id as rendezvous id) and
starts the workload in one of two ways:
  torchrun  one task per node: torch's elastic launcher, in this process, starts one worker
            per GPU of the node (1 on a CPU node unless --nproc-per-node says otherwise);
  tasks     one task per GPU (what Lightning and NAVSIM's training expect): this task is one
            rank; RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are set and the command
            replaces this process.
Before starting it checks that CUDA works where the step has GPUs (`runtime.cuda_check`: a
cause such as a driver too old for the image's torch is exit 3), can wait for free GPU
memory (the field notes' wait-and-run wrapper), caps DataLoader workers by the task's CPUs
and the host memory, and logs whether InfiniBand is visible and which NCCL settings are in
force. Where the job asks for it (GPU jobs: the TRAIN_GPU_* settings), node-local rank 0
starts the GPU utilisation sampler (`runtime.gpuwatch`) as a process of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train import _proc
from train.errors import ResourceError, UsageError
from train.runtime import cuda_check
from train.runtime.hostmem import DEFAULT_WORKER_MEM_MB
from train.secrets import masked_argv, recorded_environment
from train.slurm.contract import DEADLINE_VAR, FALLBACK_BATCH_VAR, STOP_SIGNAL_VAR
from train.workloads.navsim import NAVSIM_PREFETCH_OVERRIDE, NAVSIM_WORKERS_OVERRIDE

log = logging.getLogger(__name__)

# A hung collective fails the job with a message instead of burning the walltime.
NCCL_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"}
WORKER_VAR = "TRAIN_DATALOADER_WORKERS"
WORKER_OVERRIDE = NAVSIM_WORKERS_OVERRIDE
PREFETCH_OVERRIDE = NAVSIM_PREFETCH_OVERRIDE
# set it where node names do not resolve inside the container
MASTER_ADDR_VAR = "TRAIN_MASTER_ADDR"
MIB = 1024 * 1024


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
    from train.runtime.nodelist import expand_nodes

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


def tasks_env(step: SlurmStep, master_addr: str) -> dict[str, str]:
    return {"RANK": str(step.procid), "LOCAL_RANK": str(step.localid),
            "WORLD_SIZE": str(step.ntasks), "LOCAL_WORLD_SIZE": str(step.ntasks_per_node),
            "NODE_RANK": str(step.node_id), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(step.port)}


def cap_workers(requested: int, cpus: int, procs_per_node: int, host_free: int,
                per_worker: int) -> tuple[int, str]:
    """DataLoader workers per process that the task's CPUs and the host memory allow."""
    by_cpu = max(0, cpus - 1)  # one CPU for the training process itself
    by_mem = host_free // max(1, procs_per_node * per_worker)
    allowed = min(requested, by_cpu, by_mem)
    reason = (f"requested {requested}, {cpus} CPUs allow {by_cpu}, host memory "
              f"{host_free // MIB} MiB / ({procs_per_node} processes x "
              f"{per_worker // MIB} MiB) allows {by_mem}")
    return max(0, allowed), reason


def host_free_bytes() -> int:
    """What the node's processes can still allocate: MemAvailable within the job's cgroup."""
    from train.runtime.hostmem import available_bytes

    return available_bytes()


def wait_for_gpu_memory(min_free_mb: int, timeout: float, poll: float = 10.0) -> bool:
    """True once every visible GPU has min_free_mb free; False on timeout."""
    try:
        import pynvml
    except ImportError:
        log.info("GPU memory wait skipped: NVIDIA's management library is not installed")
        return True
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("GPU memory wait skipped: no NVIDIA driver here (%s)", exc)
        return True
    deadline = time.monotonic() + timeout
    try:
        while True:
            free = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).free
                    for i in range(pynvml.nvmlDeviceGetCount())]
            if all(f >= min_free_mb * MIB for f in free):
                log.info("GPU memory free: %s MiB (need %d)", [f // MIB for f in free],
                         min_free_mb)
                return True
            if time.monotonic() >= deadline:
                return False
            log.info("waiting for %d MiB free on every GPU, have %s MiB", min_free_mb,
                     [f // MIB for f in free])
            # never past the deadline: a --wait-timeout shorter than the poll is kept
            time.sleep(max(0.0, min(poll, deadline - time.monotonic())))
    finally:
        pynvml.nvmlShutdown()


def check_cuda(step: SlurmStep, env: Mapping[str, str]) -> None:
    """A step with GPUs starts no worker unless CUDA works here: the cause (driver too old
    for the image's torch, no `--nv`, ...) as a ResourceError, not workers on the CPU."""
    if step.gpus_on_node == 0:
        return
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # a program of the image's own (tasks)
        log.info("CUDA check skipped: this image's Python has no torch")
        return
    problem = cuda_check.check(cuda_check.gather_facts(env))
    if problem is not None:
        raise ResourceError(f"this step has {step.gpus_on_node} GPU(s) on node "
                            f"{step.nodes[step.node_id]}, but {problem}")
    log.info("CUDA check passed: %d GPU(s) usable", step.gpus_on_node)


def log_interconnect(env: Mapping[str, str]) -> None:
    ib = Path("/sys/class/infiniband")
    devices = sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []
    if devices:
        log.info("InfiniBand visible: %s", ", ".join(devices))
    else:
        log.info("InfiniBand not visible: NCCL will use TCP sockets across nodes")
    nccl = recorded_environment(env, ("NCCL_", "TORCH_NCCL_"))  # NCCL_IB_PASSWD: redacted
    log.info("NCCL settings: %s", nccl or "defaults")


def apply_nccl_defaults(env: MutableMapping[str, str]) -> None:
    for key, value in NCCL_DEFAULTS.items():
        env.setdefault(key, value)


def need_torch() -> None:
    """--mode torchrun runs torch's launcher in this process: an image without torch is
    said in one line (exit 3), not as a traceback on every node."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ResourceError(f"--launch torchrun runs torch's launcher, and this image's "
                            f"Python ({sys.executable}) cannot import torch: use an image "
                            "with torch, or --launch tasks (the program starts its ranks "
                            "itself)")


@dataclass(frozen=True)
class LaunchOptions:
    mode: str
    command: list[str]
    nproc_per_node: int | None = None
    min_free_mb: int | None = None
    wait_timeout: float = 3600.0
    fallback_batch: int | None = None
    workers: int | None = None
    worker_mem_mb: int = DEFAULT_WORKER_MEM_MB
    chdir: str | None = None


def prepare(opts: LaunchOptions, env: MutableMapping[str, str]) -> tuple[SlurmStep, str,
                                                                           list[str]]:
    """Everything before starting: checks, waits, caps. Returns (step, master, command)."""
    log.info("launch started at unix time %.3f", time.time())
    if not opts.command:
        raise UsageError("launch: give the command after --, e.g. -- python -m train run demo")
    if opts.mode == "torchrun":
        need_torch()
    step = read_step(env)
    check_cuda(step, env)  # before the memory wait: a broken CUDA never frees up
    # (one process alone has no rendezvous: its node's name need not resolve)
    master = env.get(MASTER_ADDR_VAR) or (step.master if opts.mode == "single"
                                          else resolve_address(step.master))
    command = list(opts.command)
    apply_nccl_defaults(env)
    log_interconnect(env)
    if opts.min_free_mb is not None:
        if step.gpus_on_node == 0:
            log.info("GPU memory wait skipped: no GPU on this node")
        else:
            command = _wait_or_fall_back(opts, env, command)
    if opts.workers is not None:
        procs = (opts.nproc_per_node or max(1, step.gpus_on_node)) if opts.mode == "torchrun" \
            else step.ntasks_per_node
        cpus = step.cpus_per_task // procs if opts.mode == "torchrun" else step.cpus_per_task
        allowed, why = cap_workers(opts.workers, cpus, procs, host_free_bytes(),
                                   opts.worker_mem_mb * MIB)
        log.info("DataLoader workers per process: %d (%s)", allowed, why)
        env[WORKER_VAR] = str(allowed)
        # a Hydra override for the workers (NAVSIM's preset) gets the capped value too, and
        # with none left, DataLoader's prefetch_factor must be null (torch refuses it)
        if any(a.startswith(WORKER_OVERRIDE + "=") for a in command):
            command = [f"{WORKER_OVERRIDE}={allowed}" if a.startswith(WORKER_OVERRIDE + "=")
                       else a for a in command]
            if allowed == 0 and not any(a.startswith(PREFETCH_OVERRIDE + "=")
                                        for a in command):
                command.append(f"{PREFETCH_OVERRIDE}=null")
    return step, master, command


# what is left for the work itself when the wait ends at the latest
MIN_WORK_SECONDS = 60


def wait_budget(timeout: float, env: Mapping[str, str], now: float) -> float:
    """The wait's timeout, cut so that the wait never eats the chunk's time budget: it
    ends MIN_WORK_SECONDS before the deadline at the latest."""
    from train.runtime.signals import parse_deadline

    deadline = parse_deadline(env.get(DEADLINE_VAR, ""))
    if deadline is None:
        return timeout
    return max(0.0, min(timeout, deadline - now - MIN_WORK_SECONDS))


def _wait_or_fall_back(opts: LaunchOptions, env: MutableMapping[str, str],
                       command: list[str]) -> list[str]:
    assert opts.min_free_mb is not None
    start = time.time()
    timeout = wait_budget(opts.wait_timeout, env, start)
    if timeout < opts.wait_timeout:
        log.info("GPU memory wait: at most %.0f s (the chunk's deadline leaves that, not "
                 "the %g s asked for)", timeout, opts.wait_timeout)
    ok = wait_for_gpu_memory(opts.min_free_mb, timeout)
    used = time.time() - start
    log.info("GPU memory wait took %.0f s of the chunk's time budget", used)
    if ok:
        return command
    if opts.fallback_batch is None:
        raise ResourceError(f"GPUs did not reach {opts.min_free_mb} MiB free within "
                            f"{timeout:.0f} s (the wait's limit)")
    log.warning("GPU memory still short after %.0f s: falling back to batch size %d",
                used, opts.fallback_batch)
    env[FALLBACK_BATCH_VAR] = str(opts.fallback_batch)  # the run may resume with it
    return [*command, "--batch-size", str(opts.fallback_batch)]


# Inside the step `scontrol requeue` (Lightning's SLURM plugin runs it on the walltime
# signal, after saving its checkpoint) must not requeue the job from inside: the chain
# goes on by itself. This stand-in asks the batch shell to end the step (TERM to its
# tasks: Lightning then exits 0) by writing the file TRAIN_STOP_REQUEST names; the next
# chunk resumes from the checkpoint. Anything else goes to the real scontrol, if any.
SCONTROL_SHIM = """#!/bin/sh
[ "${1:-}" != --train-shim-probe ] || exit 0
if [ -n "${TRAIN_SHIM_ACTIVE:-}" ]; then  # found itself again: no real scontrol here
    echo "train: no scontrol on PATH besides train's stand-in" >&2
    exit 127
fi
if [ "${1:-}" = requeue ]; then
    # (a temporary name of this process's own: every task of the step may ask at once)
    tmp="${TRAIN_STOP_REQUEST:-}.tmp.${SLURM_PROCID:-0}.$$"
    if [ -z "${TRAIN_STOP_REQUEST:-}" ] || ! { echo "requeue ${2:-}" > "$tmp" && \
            mv "$tmp" "$TRAIN_STOP_REQUEST"; }; then
        echo "train: scontrol requeue is not run inside a job step, and the request to end" \
            "this chunk could not be written (${TRAIN_STOP_REQUEST:-no TRAIN_STOP_REQUEST})" >&2
        exit 1
    fi
    echo "train: the program asked to requeue job ${2:-}: this chunk ends now (its" \
        "checkpoint is written) and the chain's next chunk continues" >&2
    exit 0
fi
self_dir=$(cd "$(dirname "$0")" && pwd -P)
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | while IFS= read -r d; do
    [ "$(cd "$d" 2>/dev/null && pwd -P)" = "$self_dir" ] || printf '%s\n' "$d"
done | paste -sd: -)
TRAIN_SHIM_ACTIVE=1
export PATH TRAIN_SHIM_ACTIVE
exec scontrol "$@"
"""


SHIM_FOLDER = ".scontrol-shim"


def install_scontrol_shim(env: MutableMapping[str, str]) -> Path | None:
    """Put the stand-in first on PATH for the program (and its children). It lives in the
    run folder (one per run, rewritten in place by each launch: nothing is left in /tmp,
    whose noexec mounts at some sites would also make the stand-in be skipped for the real
    scontrol); a run folder where it cannot execute falls back to a fresh folder under
    $TMPDIR, returned so that a launch that does not exec can remove it. Returns the
    folder, or None where the program keeps the real scontrol."""
    import subprocess
    import tempfile

    run_dir = env.get("TRAIN_RUN_DIR")
    places: list[Path | None] = [Path(run_dir) / SHIM_FOLDER] if run_dir else []
    places.append(None)
    for place in places:
        try:
            if place is None:
                folder = Path(tempfile.mkdtemp(prefix=".train-shim-",
                                               dir=os.environ.get("TMPDIR")))
            else:
                folder = place
                folder.mkdir(exist_ok=True)
            shim = folder / "scontrol"
            _write_shim(shim)
            subprocess.run([str(shim), "--train-shim-probe"], check=True, timeout=30,
                           capture_output=True)
        except (OSError, subprocess.SubprocessError):
            if place is None:
                with contextlib.suppress(NameError, OSError):
                    _remove_shim(folder)
            continue
        path = env.get("PATH") or os.defpath
        env["PATH"] = f"{folder}{os.pathsep}{path}"
        return folder
    log.warning("no place to run the scontrol stand-in: a program that runs `scontrol "
                "requeue` (Lightning's SLURM support) would requeue the job from inside")
    return None


def _write_shim(shim: Path) -> None:
    """Write the stand-in unless it is there already: a new file renamed over the old one
    (tasks on other nodes may be running it), with an old modification time, so that it
    never looks like something the program saved during the chunk."""
    with contextlib.suppress(OSError):
        if shim.read_text(encoding="utf-8") == SCONTROL_SHIM and os.access(shim, os.X_OK):
            return
    tmp = shim.with_name(f".scontrol.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        tmp.write_text(SCONTROL_SHIM, encoding="utf-8")
        tmp.chmod(0o755)
        os.utime(tmp, (0, 0))
        os.replace(tmp, shim)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _remove_shim(folder: Path | None) -> None:
    """A stand-in folder of this launch's own under $TMPDIR (never the run folder's)."""
    if folder is None or folder.name == SHIM_FOLDER:
        return
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


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


def start_gpu_watch(step: SlurmStep, mode: str, env: Mapping[str, str],
                    spawn: Callable[..., Any] | None = None) -> Any:
    """Start the node's GPU sampler (node-local rank 0 only: torch's launcher agent, or the
    task with local id 0) when the job's settings ask for one and the node has GPUs. The
    sampler's parent is this process (in tasks mode the program it execs into, the same
    pid). Never fails the launch: any problem is a warning. Returns the process or None."""
    from train.runtime import gpuwatch

    if step.gpus_on_node == 0 or (mode != "torchrun" and step.localid != 0):
        return None
    try:
        settings = gpuwatch.settings_from_env(env)
    except ValueError as exc:
        log.warning("GPU watch not started: %s", exc)
        return None
    run_dir = env.get("TRAIN_RUN_DIR")
    if settings is None or not run_dir:
        return None
    node = step.nodes[step.node_id]
    try:
        return (spawn or gpuwatch.spawn)(run_dir, node, settings, os.getpid(),
                                         env=dict(env))
    except Exception as exc:  # whatever starting it raises: training goes on without it
        log.warning("GPU watch not started on %s: %s", node, exc)
        return None


def _stop_gpu_watch(proc: Any) -> None:
    if proc is None:
        return
    with contextlib.suppress(Exception):
        proc.terminate()
        proc.wait(timeout=10)


def find_program(command: Sequence[str], env: Mapping[str, str]) -> None:
    """A program that is not there fails now, by name, not as a traceback per rank."""
    import shutil

    program = command[0]
    if "/" in program:
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            raise UsageError(f"launch: {program} is not an executable file here (inside "
                             "the container, if the job runs in one)")
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise UsageError(f"launch: program {program!r} is not on PATH here (inside the "
                         "container, if the job runs in one); PATH is "
                         f"{env.get('PATH', os.defpath)}")


LIGHTNING_ROOT_VAR = "PL_TRAINER_DEFAULT_ROOT_DIR"


def program_environment(step: SlurmStep, mode: str, env: MutableMapping[str, str]) -> None:
    """Defaults for the program that the user's own setting (--env, or the host's value
    with runtime none) always beats: Lightning's default_root_dir is the run folder (its
    hpc checkpoints are saved and restored there, never in the submit folder another run
    shares; a Trainer(default_root_dir=...) of the script still wins), and in tasks mode
    the OpenMP threads of each rank are its task's CPUs (torchrun sets 1 for its workers)."""
    run_dir = env.get("TRAIN_RUN_DIR")
    if run_dir and LIGHTNING_ROOT_VAR not in env:
        env[LIGHTNING_ROOT_VAR] = run_dir
    if mode == "tasks" and "OMP_NUM_THREADS" not in env and env.get("SLURM_CPUS_PER_TASK"):
        env["OMP_NUM_THREADS"] = str(step.cpus_per_task)
        log.info("OMP_NUM_THREADS=%d (the task's CPUs)", step.cpus_per_task)


def enter_folder(folder: str | None) -> None:
    """--chdir: the program runs in this folder (relative paths it reads are from there)."""
    if folder is None:
        return
    try:
        os.chdir(folder)
    except OSError as exc:
        raise UsageError(f"launch: --chdir {folder}: {exc.strerror or exc} here (inside the "
                         "container, if the job runs in one)") from None
    log.info("working folder: %s", folder)


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
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
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


def launch(opts: LaunchOptions, env: MutableMapping[str, str] | None = None) -> int:
    """torchrun mode returns when the node's workers are done; tasks mode execs."""
    environ = os.environ if env is None else env
    step, master, command = prepare(opts, environ)
    enter_folder(opts.chdir)
    # (torchrun runs `python -m MODULE` with its own interpreter: no program to find)
    if opts.mode != "torchrun" or "--no-python" in torchrun_argv(step, master, 1, command):
        find_program(command, environ)
    program_environment(step, opts.mode, environ)
    # the stand-in turns `scontrol requeue` into "end this chunk": only under the job's
    # batch shell, which watches for that request
    shim = install_scontrol_shim(environ) if environ.get("TRAIN_STOP_REQUEST") else None
    watcher = start_gpu_watch(step, opts.mode, environ)
    if opts.mode == "torchrun":
        signal.signal(signal.SIGUSR1, _forward_to_workers)
        nproc = opts.nproc_per_node or max(1, step.gpus_on_node)
        import shutil
        import tempfile

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
            return worker_failure(exc, step.nodes[step.node_id],
                                  stop_signal_for_workers(environ))
        finally:
            _stop_gpu_watch(watcher)
            _remove_shim(shim)
            shutil.rmtree(agent_dir, ignore_errors=True)
        return 0
    if opts.mode == "single":
        log.info("single process: %s", " ".join(masked_argv(command)))
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvpe(command[0], command, dict(environ))  # noqa: S606 (argv list, no shell)
    environ.update(tasks_env(step, master))
    log.info("rank %d/%d (node %d, local %d), master %s:%d: %s", step.procid, step.ntasks,
             step.node_id, step.localid, master, step.port, " ".join(masked_argv(command)))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], command, dict(environ))  # noqa: S606 (argv list, no shell)
