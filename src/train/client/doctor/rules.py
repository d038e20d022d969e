"""The log rules: each cause the doctor recognises by a message in a job log, with the
literal needles that select candidate lines, the pattern that refines them and where the
message's format comes from."""

from __future__ import annotations

import re
from dataclasses import dataclass

from train.batch.task import NV_NO_DRIVER


@dataclass(frozen=True)
class LogRule:
    """A cause recognised by a message in a job log.

    `needles`: literal substrings that select candidate lines (long and distinctive: they
    are what the fast search looks for); `pattern`: refines a candidate line (None: every
    candidate counts). `source`: where the message's format comes from.
    """

    cause: str
    needles: tuple[str, ...]
    pattern: re.Pattern[str] | None
    source: str


# A line's own prefix before a message: torch's "[rank1]:", torchrun --tee's "[default1]:"
# (the local rank), srun --label's "1: ", Open MPI's "[1,0]<stderr>:". An exception counts
# where it starts the line (after such a prefix): "Warning: ImportError: apex not
# installed" or a path ".../MemoryError_logs/" is not one.
_LEAD = r"^\s*(?:\[(?:rank ?|default)\d+\]:?\s*|\d+:\s+|\[[\d,]+\]<std\w+>:\s*)?"


def _exception(*names: str) -> str:
    """A pattern for a line that is one of these exceptions (module prefixes allowed)."""
    return _LEAD + r"(?:[\w.]+\.)?(?:" + "|".join(names) + r")\b(?::|$)"


def _banner(reason: str) -> str:
    """slurmstepd's own line when it ends a job or step (src/slurmd/slurmstepd/req.c)."""
    return r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO " + reason


RENDEZVOUS_DONE = "rendezvous_complete"
RANK_ZERO_BANNER = "rank_zero_banner"
# Ordered by how decisive a message is: when one log holds several, the first rule that
# matched explains the failure and the others are listed as well.
RULES: tuple[LogRule, ...] = (
    LogRule("host_oom", ("oom_kill event", "oom-kill event", "Exceeded job memory limit",
                         "MemoryError", "Cannot allocate memory"),
            re.compile(r"oom[_-]kill event|Exceeded job memory limit|Cannot allocate memory|"
                       + _exception("MemoryError")),
            "slurmstepd (task/cgroup): 'Detected N oom_kill events in StepId=J.S. "
            "Some of the step tasks have been OOM Killed.'; older: 'Exceeded job memory "
            "limit'; Python under a memory limit: 'MemoryError'; ENOMEM: 'Cannot allocate "
            "memory'"),
    LogRule("gpu_oom", ("CUDA out of memory", "OutOfMemoryError", "while preallocating",
                        "CUBLAS_STATUS_ALLOC_FAILED", "HIP out of memory"),
            re.compile(r"(?:CUDA|HIP) out of memory|while preallocating|"
                       r"CUBLAS_STATUS_ALLOC_FAILED|" + _exception("OutOfMemoryError")),
            "torch: 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "...'; ours: PreallocationError 'out of memory on cuda:0 ... while "
            "preallocating ...'"),
    LogRule("rendezvous", ("clients joined", "RendezvousTimeoutError",
                           "RendezvousClosedError", "waiting for clients",
                           "Initializing distributed:"),
            None, "torch c10d TCPStore: 'Timed out after N seconds waiting for clients. "
            "K/W clients joined.'; torch elastic: RendezvousTimeoutError; Lightning: "
            "'Initializing distributed: GLOBAL_RANK: r, MEMBER: m/W'"),
    LogRule("collective_timeout", ("collective operation timeout", "Watchdog caught",
                                   "ms for recv operation", "NCCL communicator was aborted",
                                   "ProcessGroupNCCL's watchdog"),
            None, "torch ProcessGroupNCCL: '[Rank r] Watchdog caught collective operation "
            "timeout: WorkNCCL(...) ran for N milliseconds before timing out'; gloo: "
            "'Timed out waiting Nms for recv operation to complete'"),
    LogRule("walltime", ("DUE TO TIME LIMIT",), re.compile(_banner("TIME LIMIT")),
            "slurmstepd: '*** JOB J ON NODE CANCELLED AT T DUE TO TIME LIMIT ***'"),
    LogRule("preempted", ("DUE TO PREEMPTION",), re.compile(_banner("PREEMPTION")),
            "slurmstepd: '*** JOB J ON NODE CANCELLED AT T DUE TO PREEMPTION ***'"),
    LogRule("node_failure", ("DUE TO NODE FAILURE", "Node failure on"),
            re.compile(_banner("NODE FAILURE") + r"|srun: error: Node failure on"),
            "slurmstepd: '... DUE TO NODE FAILURE ***'; srun: 'srun: error: Node failure "
            "on NODE'"),
    LogRule("nonfinite", ("without overflow", "non-finite", "nan or inf", "inf or nan",
                          "returned nan values", "loss is nan", "Loss is NaN"),
            re.compile(r"to type at::Half without overflow|is non-finite|"
                       r"non-finite (?:loss|value)|(?i:\bloss (?:is|=|:) ?nan\b)|"
                       r"returned nan values|(?:found|detected) (?:nan or inf|inf or nan)",
                       re.IGNORECASE),
            "torch: 'RuntimeError: value cannot be converted to type at::Half without "
            "overflow' (a -1e9 mask in fp16), clip_grad_norm_: 'the total norm ... is "
            "non-finite'; anomaly mode: 'Function X returned nan values'; Lightning/user "
            "loops: 'loss is nan', 'detected inf or nan'"),
    LogRule("cuda_driver", ("driver on your system is too old",
                            "driver version is insufficient",
                            "the NVIDIA driver is too old", "cudaErrorInsufficientDriver"),
            None, "torch: 'The NVIDIA driver on your system is too old (found version N)'; "
            "CUDA runtime: 'CUDA driver version is insufficient for CUDA runtime version'; "
            "ours: 'CUDA is unusable: the NVIDIA driver is too old for this torch'"),
    LogRule("missing_payload", ("needs the StarCraft II binary", "StarCraft II binary",
                                "MoveToBeacon", "OPENSCENE_DATA_ROOT",
                                "NAVSIM_DEVKIT_ROOT", "needs pysc2"),
            re.compile(r"train: error|Error\b|error:|No such file|not found|does not exist|"
                       r"is broken|has no "),
            "ours (EnvironmentUnavailable): 'workload sc2 needs the StarCraft II "
            "binary: SC2PATH=...'; NAVSIM: a KeyError or missing path naming "
            "OPENSCENE_DATA_ROOT / NAVSIM_DEVKIT_ROOT"),
    LogRule("module_missing", ("module(s) are unknown", "Lmod has detected the following",
                               "Unable to locate a modulefile", "module: command not found"),
            None, "Lmod: 'Lmod has detected the following error: The following module(s) "
            "are unknown: \"x\"'; Environment Modules: 'ERROR: Unable to locate a "
            "modulefile for 'x''"),
    # before image_unopenable: Apptainer says "container creation failed" for both
    LogRule("bind_missing", ("mount source", "bind source path does not exist"),
            re.compile(r"mount source \S+ doesn't exist|bind source path does not exist"),
            "Apptainer 1.1-1.4: 'FATAL:   container creation failed: mount hook function "
            "failure: mount /depot->/depot error: while mounting /depot: mount source "
            "/depot doesn't exist'; Docker: 'invalid mount config for type \"bind\": bind "
            "source path does not exist: /depot'"),
    LogRule("nv_no_driver", (NV_NO_DRIVER,), None,
            "ours (client/container.py's apptainer task wrapper; Apptainer 1.4 starts --nv "
            "without a word): 'train: apptainer --nv on NODE: " + NV_NO_DRIVER
            + " (/dev/nvidiactl is missing): the program sees no GPU'"),
    LogRule("image_unopenable", ("could not open image", "FATAL:   container creation failed",
                                 "FATAL:   Unable to handle", "FATAL:   image format",
                                 "is not a valid SIF", "No such image:"),
            None, "Apptainer: 'FATAL:   could not open image /p/x.sif: ...', 'FATAL:   "
            "Unable to handle docker://... uri'; Docker: 'No such image: NAME'"),
    LogRule("program_missing", ("execve():", ": command not found", "exec format error"),
            re.compile(r"execve\(\)|(?<!module): command not found|exec format error"),
            "srun: 'srun: error: NODE: task 0: execve(): PROG: No such file or directory'; "
            "bash: 'PROG: command not found'"),
    LogRule("import_error", ("ModuleNotFoundError", "ImportError"),
            re.compile(_exception("ModuleNotFoundError", "ImportError")),
            "Python: 'ModuleNotFoundError: No module named 'x'', 'ImportError: cannot "
            "import name ...', 'ImportError: libX.so: cannot open shared object file'"),
    LogRule("stop_signal_unhandled", ("died of the stop signal",
                                      "reached a worker that has no handler"),
            None, "ours: the batch shell's 'the program died of the stop signal USR1: it "
            "needs a handler ...'; train launch under torchrun: 'the stop signal USR1 "
            "reached a worker that has no handler for it'"),
    # libstdc++'s std::terminate with no exception: a C++ thread object destroyed while
    # it runs, as gloo's teardown does when a peer has left first (after the work)
    LogRule("teardown_abort", ("terminate called without an active exception",), None,
            "libstdc++ (__verbose_terminate_handler): 'terminate called without an active "
            "exception', then SIGABRT; torch's gloo at the process group's teardown "
            "(torch 2.13, CPU jobs: docs/your-program.md, \"A known trap on CPU (gloo)\")"),
    LogRule("disk_full", ("No space left on device", "Disk quota exceeded",
                          "[Errno 28]", "[Errno 122]"),
            None, "the kernel's ENOSPC and EDQUOT as Python and tools print them"),
    LogRule("train_error", ("train: error: ",), None,
            "ours: the CLI's one-line error for bad input or a missing resource"),
    # not a cause: Lightning's banner, printed by global rank 0 only; every process of a
    # multi-process job printing it means each trained alone (ranks_alone)
    LogRule(RANK_ZERO_BANNER, ("GPU available: ",),
            re.compile(r"GPU available: (?:True|False)\b"),
            "Lightning (trainer/connectors/accelerator_connector.py, rank_zero_info): 'GPU "
            "available: True (cuda), used: True'"),
    # not a cause: the group met (a partial count of member lines is then no finding)
    LogRule(RENDEZVOUS_DONE, ("All distributed processes registered",
                              "Rendezvous complete for workers"), None,
            "Lightning (lightning_fabric/utilities/distributed.py, rank 0 only): 'All "
            "distributed processes registered. Starting with W processes'; torch elastic "
            "agent: '[default] Rendezvous complete for workers. Result: ...'"),
)
_ALL_NEEDLES = tuple(sorted({n for r in RULES for n in r.needles}))
_MEMBER_RE = re.compile(r"GLOBAL_RANK: (\d+), MEMBER: (\d+)/(\d+)")
_JOINED_RE = re.compile(r"(\d+)/(\d+) clients joined")
_EXCEPTION_RE = re.compile(_LEAD + r"([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))"
                           r"(?:: ?(.*))?$")
