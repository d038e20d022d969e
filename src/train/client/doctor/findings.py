"""What the doctor's rules find: a line of evidence, a rule's hits in one file, and a
finding (a cause with its evidence and fix); for each cause its title and what to change,
as flags and values where the chain's record (its resources) says them."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from train.client.slurm.chain import Chain
from train.client.slurm.chaincost import integer, resources
from train.common.hostmem import DEFAULT_WORKER_MEM_MB

_KEEP = 3  # evidence lines kept per rule and file: the first and the last ones


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int  # 1-based; 0 where unknown (in the tail of a log searched in head and tail)
    text: str
    offset: int | None = None  # where the line starts in the file, where line is unknown

    def as_dict(self) -> dict[str, Any]:
        out = {"file": self.file, "line": self.line, "text": self.text}
        return out if self.offset is None else {**out, "offset": self.offset}

    @property
    def where(self) -> str:
        """file:line, or file (byte N) where only the line's offset is known."""
        if self.line:
            return f"{self.file}:{self.line}"
        return self.file if self.offset is None else f"{self.file} (byte {self.offset})"


@dataclass
class Finding:
    cause: str
    title: str  # what happened, in a few words
    fix: str  # what to change: flags and values where they are known
    chunk: int | None = None
    job_id: str | None = None
    evidence: list[Evidence] = field(default_factory=list)
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "title": self.title, "detail": self.detail,
                "fix": self.fix, "chunk": self.chunk, "job_id": self.job_id,
                "evidence": [e.as_dict() for e in self.evidence]}


@dataclass
class Hits:
    """What one rule found in one file: the first and the last few lines, and a count."""

    count: int = 0
    first: list[Evidence] = field(default_factory=list)
    last: deque[Evidence] = field(default_factory=lambda: deque(maxlen=_KEEP))

    def add(self, ev: Evidence) -> None:
        self.count += 1
        if len(self.first) < _KEEP:
            self.first.append(ev)
        else:
            self.last.append(ev)

    def evidence(self) -> list[Evidence]:
        return [*self.first, *self.last]


def _gib(mb: int) -> str:
    return f"{mb / 1024:.0f}G" if mb >= 1024 else f"{mb}M"


# a job whose memory is at least this share of its node's has (nearly) the whole node:
# more --mem cannot help it
_NEAR_WHOLE_NODE = 0.9


def _fix_host_oom(chain: Chain, _hits: Hits | None) -> str:
    """Fewer DataLoader workers first where they can be what filled the memory (each
    counted at least at DEFAULT_WORKER_MEM_MB, the field's evidence: the same figure and
    the same arithmetic as the job's up-front check) or where the job already has (nearly)
    its whole node; more --mem only where neither is so. A command's own workers, which
    train does not know, are named first."""
    res = resources(chain.record)
    procs, workers = integer(res.get("processes_per_node")), integer(res.get("workers"))
    recorded, mem = integer(res.get("worker_mem_mb")), integer(res.get("mem_mb"))
    node = integer(res.get("node_mem_mb"))
    if not (procs and mem):
        return ("fewer DataLoader workers (--workers) or more host memory (--mem); "
                "`train launch` caps the workers by memory when --worker-mem says what one "
                "needs")
    whole = node is not None and mem >= node * _NEAR_WHOLE_NODE
    on_node = f"the job has {'the whole' if mem >= node else 'nearly the whole'} " \
        f"{_gib(node)} node, so more --mem cannot help" if whole and node else ""
    if workers:
        per = max(recorded or 0, DEFAULT_WORKER_MEM_MB)
        need = procs * workers * per
        why = f"{procs} processes x {workers} DataLoader workers, each counted at {_gib(per)}"
        if recorded is not None and recorded < per:
            why += (f" (not the job's --worker-mem {_gib(recorded)}: the field's 32 workers "
                    "on a 256 GB node were OOM-killed, more than 8G each)")
        if need > mem:
            fit = min(workers - 1, mem // (procs * per))
            text = (f"--workers {fit}: {why}, need {_gib(need)} of the job's {_gib(mem)} "
                    f"per node; {_gib(mem)} // ({procs} x {_gib(per)}) = "
                    f"{mem // (procs * per)} per process fit")
            if fit == 0:
                text += " (--workers 0 loads the data in the training process itself)"
            return text + (f"; {on_node}" if on_node else "; or more --mem")
        if whole:
            return (f"--workers {workers - 1}: {on_node}, and the DataLoader workers are "
                    f"what can give memory back ({why}: {_gib(need)}); then hold less in "
                    "memory (a smaller dataset or replay buffer)")
    up_to = f" (up to the node's {_gib(node)}, or --mem 0 for all of it)" if node else ""
    if not workers and chain.record.get("entry") == "command":
        # the program's own DataLoader (its num_workers), which train neither sets nor
        # counts: the field notes' case, a Lightning script's 8 workers per GPU
        return (f"fewer DataLoader workers in the program (its num_workers: train does not "
                f"set or count them for --entry command; {procs} processes per node x N "
                "workers, each a copy of the dataset's state, often several GB: the field's "
                "8 per GPU on 256 GB nodes were OOM-killed, 2 per GPU fit); "
                + (f"{on_node}" if on_node else f"or more --mem{up_to}"))
    if whole:
        return (f"{on_node}: the training processes themselves fill it (the model, the "
                "replay buffer or the dataset held in memory): hold less in memory, or "
                "nodes with more memory (--partition / --constraint)")
    used = (f"the DataLoader workers take about {_gib(procs * workers * recorded)} of the "
            f"job's {_gib(mem)}, so " if workers and recorded else "")
    return (f"more --mem{up_to}: {used}the model, the replay buffer or the dataset in "
            "memory took the rest")


def _fix_gpu_oom(chain: Chain, hits: Hits | None) -> str:
    res = resources(chain.record)
    batch = integer(res.get("batch_size"))
    first_step = hits is not None and any(
        "preallocating" in e.text or "optimizer" in e.text for e in hits.evidence())
    smaller = f"--batch-size {max(1, batch // 2)}" if batch else "a smaller --batch-size"
    text = (f"{smaller}, or --precision bf16/fp16; on a shared GPU, --min-free-mb N with "
            f"--fallback-batch {max(1, batch // 2) if batch else 'B'} waits for memory and "
            "then trains with the smaller batch")
    if first_step:
        return ("it failed at the optimizer's first step (Adam's state is allocated then): "
                + text)
    return text


def _fix_rendezvous(chain: Chain, hits: Hits | None) -> str:
    res = resources(chain.record)
    launch, gpus = res.get("launch"), integer(res.get("gpus_per_node"))
    ntasks = integer(res.get("ntasks_per_node"))
    base = ("every rank must be started by srun, one task per GPU with --launch tasks "
            "(--ntasks-per-node = --gpus-per-node) or one task per node with --launch "
            "torchrun; a script run by sbatch alone starts only rank 0")
    if launch == "tasks" and gpus and ntasks and gpus != ntasks:
        return f"--ntasks-per-node {gpus} (one task per GPU; it is {ntasks}); " + base
    return base


_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


def _fix_import_error(chain: Chain, hits: Hits | None) -> str:
    """An image's job: its build lacks the module (or the host leaks in); a job of the
    nodes' own Python (runtime none) has no image to rebuild: the module goes into that
    Python's environment."""
    res = resources(chain.record)
    if res.get("runtime") != "none":
        return ("rebuild the image with the package (its lock in containers/requirements/), "
                "or remove what leaks in from the host (PYTHONPATH, a conda env: "
                "config.json's process_env shows them)")
    found = [m.group(1) for e in (hits.evidence() if hits else [])
             for m in [_MISSING_MODULE.search(e.text)] if m]
    module = found[-1].split(".")[0] if found else "the package"
    python = res.get("python") if isinstance(res.get("python"), str) else "--python"
    return (f"the job runs the nodes' own Python (--runtime none, no image): install "
            f"{module} into the environment of the Python that ran it ({python} -m pip "
            f"install {module}, with the command starting `python`, which runs --python), "
            "or give a container (--runtime apptainer --image X.sif)")


# each cause's title and fix: the text, or what makes it from the chain's resources
_TITLES_FIXES: dict[str, tuple[str, str | Callable[[Chain, Hits | None], str]]] = {
    "host_oom": ("host out of memory: the kernel's OOM killer ended tasks", _fix_host_oom),
    "gpu_oom": ("GPU out of memory", _fix_gpu_oom),
    "rendezvous": ("the ranks never all met (rendezvous incomplete)", _fix_rendezvous),
    "collective_timeout": (
        "a collective operation timed out (one rank stopped answering)",
        "find the rank that fell behind in its log (a DataLoader stall, a rank that "
        "crashed, uneven work per rank); NCCL_DEBUG=INFO and TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
        "show which; NCCL_SOCKET_IFNAME must name a network every node has"),
    "walltime": (
        "killed at the walltime before checkpointing",
        "raise --signal-margin (the stop signal comes that many seconds before the "
        "walltime; checkpointing must fit in it) or keep --time-budget on; with chunks, a "
        "shorter --time and more --max-chunks lose less"),
    "preempted": (
        "preempted by a higher-priority job",
        "submit the same job again to resume from the last checkpoint; --requeue resumes "
        "in the same job on preemptible partitions"),
    "node_failure": (
        "a node failed under the job",
        "submit the same job again (it resumes from the last checkpoint); add "
        "--exclude NODE if the same node fails again"),
    "nonfinite": (
        "non-finite values (NaN/inf) or an fp16 overflow",
        "--precision bf16 (fp16's range ends at 65504: a -1e9 attention mask or a large "
        "loss overflows) or fp32; a mask fill of torch.finfo(dtype).min instead of -1e9; "
        "a lower --lr"),
    "cuda_driver": (
        "torch's CUDA build is newer than the node's NVIDIA driver",
        "an image built for that driver (containers/base.def: BASE_IMAGE and BASE_LOCK "
        "for an older CUDA), or nodes with a newer driver (--constraint / --partition); "
        "`train doctor --preflight` compares them where the profile records drivers"),
    "missing_payload": (
        "the game or the dataset is missing where the job looked",
        "the sc2 image (it carries the game; SC2PATH), or for NAVSIM --navsim-data DIR on "
        "a file system the compute nodes mount, bound into the container"),
    "module_missing": (
        "a module the job loads does not exist on the node",
        "fix the profile's `modules:` lines (`module avail apptainer` on a compute node "
        "lists what exists), or drop them where the runtime is on the default PATH"),
    "bind_missing": (
        "a folder bound into the container does not exist on the node",
        "the profile's `binds:` (or --bind) name a file system this node does not mount: "
        "drop it from your profile (extends: SITE, binds: [...]) or --exclude the node; "
        "train submit refuses a profile bind the login node lacks"),
    "nv_no_driver": (
        "a GPU job's node has no NVIDIA driver: apptainer --nv gave the container no GPU",
        "ask for GPUs (--gpus-per-node, the GPU partition or constraint) so that the job "
        "lands on a GPU node; a CPU job takes --gpus-per-node 0 (no --nv)"),
    "image_unopenable": (
        "the container image could not be opened",
        "build or copy the image to a file system the compute nodes mount (not /tmp), "
        "check its path in --image, and `train doctor --preflight` to try opening it"),
    "import_error": ("a Python import failed", _fix_import_error),
    "disk_full": (
        "the disk or the quota is full",
        "put --out on scratch (the profile's scratch_root), free space or ask for quota; "
        "a checkpoint keeps only the last two, so a full disk is usually something else "
        "in the same quota"),
    "train_error": ("`train` refused its input or a resource", "see the message: it names "
                    "the field and what is allowed"),
    "dependency_never": (
        "a chunk waits on a dependency that can never be met",
        "`train cancel NAME` and submit the same job again (it resumes from the last "
        "checkpoint); the chunk before it failed or was cancelled"),
    "idle_gpu": (
        "the GPUs sat idle",
        "check that the program uses the GPU (--device cuda) and that the DataLoader keeps "
        "up (--workers); NYU Torch cancels jobs whose GPUs stay idle"),
    "sigkill": (
        "killed with SIGKILL and no message said why",
        "if nobody sent it (scancel --signal=KILL, a stop that outlived KillWait), it was "
        "the kernel's OOM killer: see host_oom's fix (fewer --workers, more --mem)"),
    "teardown_abort": (
        "a process aborted at its end, as the process group was torn down (torch's gloo: a "
        "known trap, not a fault of the job's nodes)",
        "the abort comes from the group's destructor, after the program's last line, so "
        "the work before it most likely finished (its output says): submit the same "
        "command again, which goes on from the last save (a program that resumes finds "
        "the work done). To avoid it, end the script with dist.barrier(), a flush and "
        "os._exit(0) (docs/your-program.md, \"A known trap on CPU (gloo)\")"),
    "native_crash": (
        "the program crashed in native code",
        "a C/C++ library crashed (CUDA, NCCL, a compiled extension): the error log's end "
        "names where; often the image's libraries do not match the node (run with "
        "--runtime apptainer --image, which binds the driver with --nv) or a GPU fault "
        "(`nvidia-smi -q` on that node)"),
    "unsaved": (
        "the chunk was stopped before the program saved anything",
        "the program must save before the stop comes: a longer --time (or a shorter "
        "interval between its saves), and --save-path for where it saves when that is "
        "outside the run folder; submitting the same run again continues at the next "
        "chunk"),
    "repeated_work": (
        "each chunk starts over from the same save: the program saves less often than once "
        "a chunk",
        "save more often than once a chunk (its save interval well under --time less the "
        "start-up), or give a longer --time; with --stop-mode kill the work since the last "
        "save is lost at every stop, so a larger --max-chunks only repeats it"),
    "resume_unverified": (
        "the chain cannot tell whether each chunk goes on from the one before: the "
        "program's progress is not known",
        "check in the job logs that each chunk resumed beyond where the one before did; "
        "where it did not, save more often than once a chunk or give a longer --time (a "
        "larger --max-chunks would repeat the same work); TRAIN_PROGRESS_FILE (DONE TOTAL) "
        "or saves named by step (checkpoint-N, *step=S*.ckpt) let the chain see it"),
    "ranks_alone": (
        "the processes never joined one group: each trained alone (world size 1)",
        "give the Trainer the job's shape: Trainer(num_nodes=N, devices=GPUS_PER_NODE, "
        "strategy='ddp') as the job has them (with --launch tasks Lightning then takes its "
        "ranks from Slurm); a plain torch script must call "
        "torch.distributed.init_process_group (train launch sets its environment)"),
    "stop_signal_unhandled": (
        "the program died of the walltime stop signal (it has no handler for it)",
        "give the program a handler (on the signal: checkpoint, then exit 0; Lightning "
        "has one under SLURM in --launch tasks), or submit with --stop-signal none and let "
        "the program save by itself before the walltime (docs/your-program.md, \"Running a "
        "program you did not write\")"),
    "program_missing": (
        "the program to run was not found",
        "the first word after `--` must exist on the nodes (runtime none) or inside the "
        "image: an absolute path or a name on its PATH"),
    "no_jobs": ("the chain records no job", "chain.ids is missing or unreadable: `train "
                "submit` writes it; submit the same job again"),
    "python_error": ("the program raised an exception", "see the exception and the lines "
                     "before it in the error log"),
    "failed": ("the job failed", "see the end of the error log shown here (`train logs "
               "NAME --err --job JOBID` for all of it)"),
    "cancelled": (
        "cancelled with scancel, not `train cancel`",
        "if you did not cancel it, the site did (an idle-GPU or a fair-share policy: see "
        "`train status` for the GPU utilisation); submit the same job again to continue "
        "from the checkpoint"),
}


def _finding(chain: Chain, cause: str, chunk: int | None, job_id: str | None,
             hits: Hits | None = None, detail: str = "") -> Finding:
    title, fix = _TITLES_FIXES[cause]
    text = fix if isinstance(fix, str) else fix(chain, hits)
    return Finding(cause, title, text, chunk, job_id,
                   hits.evidence() if hits is not None else [], detail)
