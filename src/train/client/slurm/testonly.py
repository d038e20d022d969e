"""Asking Slurm itself before anything is queued: `sbatch --test-only` with the job's own
rendered script, so that a partition, account, QOS, GRES type or time limit the site
refuses is said on the login node (exit 2, with Slurm's words and the flag or profile
field that produced the value), not after a chunk was queued.

`--test-only` validates the job and asks the scheduler when it would start; nothing is
queued. Where the site does not enforce partition limits at submit (no
`EnforcePartLimits`), Slurm accepts a time over the partition's limit and the job waits
for ever (PartitionTimeLimit): that case is the profile's max_time, checked when the job
is resolved, and `train clusters probe` corrects a profile that says otherwise.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from train.client.clusters.units import format_mem, format_time
from train.client.slurm.resolve import ResolvedJob
from train.common import _proc

TEST_TIMEOUT = 60.0

# words in Slurm's refusal -> what the job asked for (lower case; the first match wins)
_CAUSES = (("account", "account"), ("qos", "qos"), ("partition", "partition"),
           ("time limit", "time"), ("gres", "gpus"), ("generic resource", "gpus"),
           ("node configuration", "gpus"), ("memory", "mem"), ("cpu", "cpus_per_task"),
           ("feature", "constraint"), ("node count", "nodes"))


def _where(job: ResolvedJob, field: str) -> str:
    """The value the job asked for, and the flag or profile field it came from."""
    spec, prof, node = job.spec, job.profile, job.node
    base = f"profile {prof.name} ({prof.source})"
    nodes = f"partitions.{node.name}" if node.name in prof.partitions else \
        f"constraints.{node.name}"
    limit = "none" if node.max_minutes is None else format_time(node.max_minutes)
    source = "--time" if spec.time else f"{base}: default_time"
    typed = f" --gpu-type {spec.gpu_type}" if spec.gpu_type else ""
    return {
        "constraint": f"--constraint {job.constraint}",
        "nodes": f"--nodes {spec.nodes} (the profile's {nodes}.max_nodes is {node.max_nodes})",
        "partition": f"--partition {spec.partition}" if spec.partition
        else f"--partition {job.partition} (from {base}: partition.default)",
        "time": f"--time {format_time(job.minutes)} (from {source}; the profile's "
                f"{nodes}.max_time is {limit})",
        "account": f"--account {spec.account}",
        "qos": f"--qos {job.qos}" + ("" if spec.qos else f" (from {base}: qos.default)"),
        "mem": f"--mem {format_mem(job.mem_mb)} (the profile's {nodes}.mem_per_node is "
               f"{format_mem(node.mem_mb)})",
        "cpus_per_task": f"--cpus-per-task {spec.cpus_per_task} (the profile's "
                         f"{nodes}.cpus_per_node is {node.cpus_per_node})",
    }.get(field) or (f"--gpus-per-node {spec.gpus_per_node}{typed} --nodes {spec.nodes} (the "
                     f"profile's {nodes} says {node.gpus_per_node} GPUs per node, types "
                     f"{', '.join(node.gpu_types) or 'none'}; {base})")


def _beyond_nodes(job: ResolvedJob, environ: dict[str, str]) -> tuple[str, str] | None:
    """Where Slurm says no node fits the job, the CPUs or memory a node of its partition
    (or, without one, of its constraint's features) has fewer of than one node of the job
    asks, as sinfo says: (field, what was asked and what the nodes have). None where sinfo
    cannot say, or the CPUs and memory fit (the GPUs then)."""
    from train.client.clusters.probe.site import SINFO, parse_sinfo

    where = ["-p", job.partition] if job.partition else []
    try:
        proc = _proc.run([*SINFO[:2], *where, *SINFO[2:]], check=False, timeout=TEST_TIMEOUT,
                         env=environ, skip_hung=True)
        nodes = parse_sinfo(_proc.printable(proc.stdout)) if proc.returncode == 0 else []
    except (_proc.ProcError, ValueError):
        return None
    if job.partition:
        nodes = [n for n in nodes if n.partition == job.partition]
        which = f"the partition {job.partition}'s nodes"
    else:
        words = set(re.findall(r"[A-Za-z0-9_.-]+", job.constraint or ""))
        nodes = [n for n in nodes if words & set(n.features)] if words else nodes
        which = f"the nodes with {job.constraint}" if words else "the site's nodes"
    if not nodes:
        return None
    spec = job.spec
    cpus = (spec.cpus_per_task or 1) * job.ntasks_per_node
    most = max(n.cpus for n in nodes)
    if cpus > most:
        tasks = f" x {job.ntasks_per_node} tasks a node = {cpus} CPUs" \
            if job.ntasks_per_node > 1 else ""
        return "cpus_per_task", (f"--cpus-per-task {spec.cpus_per_task}{tasks}, and "
                                 f"{which} have at most {most} CPUs each (sinfo; the "
                                 f"profile says {job.node.cpus_per_node})")
    most = max(n.mem_mb for n in nodes)
    if not job.whole_node_mem and job.mem_mb > most:
        return "mem", (f"--mem {format_mem(job.mem_mb)} a node, and {which} have at most "
                       f"{format_mem(most)} each (sinfo; the profile says "
                       f"{format_mem(job.node.mem_mb)})")
    return None


def _no_gpus_asked(job: ResolvedJob) -> tuple[str, str] | None:
    """Where no node fits a job of no GPUs and sinfo cannot say what the nodes lack: its
    CPUs and memory (never the GPUs it does not ask for). None for a job of GPUs."""
    if job.spec.gpus_per_node:
        return None
    node = job.node
    mem = "the whole node's memory" if job.whole_node_mem else \
        f"--mem {format_mem(job.mem_mb)} a node"
    return "cpus_per_task", (f"--cpus-per-task {job.spec.cpus_per_task or 1} x "
                             f"{job.ntasks_per_node} task(s) a node and {mem}, no GPUs (the "
                             f"profile says {node.cpus_per_node} CPUs and "
                             f"{format_mem(node.mem_mb)} a node; sinfo could not say which "
                             "of them the nodes lack)")


def field_of(message: str) -> str:
    """The job field a refusal of Slurm's is about (gpus where it says no node fits); ''
    where the words name none (a controller that does not answer, an unknown error)."""
    low = message.lower()
    return next((f for words, f in _CAUSES if words in low), "")


def ask(job: ResolvedJob, environ: dict[str, str], begin: str | None = None
        ) -> tuple[str, str] | None:
    """(field, text) where Slurm refuses the script `train submit` would queue for this job
    (asked to start at `begin`, sbatch's --begin, where given); ('', note) where sbatch
    failed with words that name nothing of the job (submitting goes on: sbatch says it
    again or works); None where it accepts it or cannot be asked (no sbatch here:
    submitting says so)."""
    from train.client.slurm.render import render

    script = render(job)
    if shutil.which("sbatch", path=environ.get("PATH")) is None:
        return None
    with tempfile.TemporaryDirectory(prefix="train-test-only.") as folder:
        path = Path(folder) / "job.sbatch"
        path.write_text(script, encoding="utf-8")
        try:
            proc = _proc.run(["sbatch", "--test-only", *([f"--begin={begin}"] if begin
                                                          else []), str(path), "1"],
                             check=False, timeout=TEST_TIMEOUT, env=environ)
        except _proc.ProcError as exc:
            return "", f"`sbatch --test-only` could not be asked: {exc}"
    if proc.returncode == 0:
        return None
    words = _proc.tail("; ".join(line.strip() for line in proc.stderr[-_proc.STDERR_KEPT:]
                                 .splitlines() if line.strip()), 500)  # no flood, no escapes
    words = words or f"exit status {proc.returncode}"
    field = field_of(words)
    if not field:
        return "", f"`sbatch --test-only` failed, naming nothing of the job: {words}"
    where = _where(job, field)
    if "node configuration" in words.lower():  # no node fits: GPUs, CPUs or memory
        field, where = _beyond_nodes(job, environ) or _no_gpus_asked(job) or (field, where)
    return field, (f"Slurm refuses this job (`sbatch --test-only`: {words}); it asked for "
                   f"{where}; nothing was queued; `train clusters probe "
                   f"{job.profile.name}` compares the profile with the site (--no-check "
                   "submits without asking)")


# Slurm 22.05 starts a job that has --time-min with that minimum as its time limit even on
# idle nodes (tried on the local clusters: 22.05.8 gives 2:00 of `-t 10 --time-min 2`; 24.11
# gives 10:00 where its main scheduler starts the job and often 2:00 where backfill does;
# 26.05 gives 10:00); releases before this are taken to do the same. (24.11's floor-long
# chunks still go on, counted in time: docs/your-program.md says so.)
FLOOR_STARTS_SHORT_BEFORE = (23, 0)


def floor_starts_short(environ: dict[str, str] | None = None) -> str | None:
    """The Slurm release (`sbatch --version`) where a default floor (--time-min) would make
    every chunk start short, or None (a later release, or no answer: the floor stays)."""
    try:
        out = _proc.run(["sbatch", "--version"], timeout=TEST_TIMEOUT, env=environ,
                        skip_hung=True).stdout
    except _proc.ProcError:
        return None
    words = out.split()
    numbers = words[1].split(".")[:2] if len(words) > 1 else []
    if len(numbers) == 2 and all(n.isdigit() for n in numbers) and \
            (int(numbers[0]), int(numbers[1])) < FLOOR_STARTS_SHORT_BEFORE:
        return words[1]
    return None
