"""`train launch` on the local 2-node SLURM cluster: rendezvous time (all tasks started to
all ranks joined) and submit-to-first-step time against hand-written `srun` jobs doing the
same DDP run (one rank per node), alternating in the same run. Goal: ratio <= 1.05.

The jobs' PATH finds `python3` as an interpreter (`direct_python3`), as on the clusters
(/usr/bin/python3, a module's): the chain engine runs with the python3 of the job's PATH,
the hand-written jobs name their interpreter, and a version manager's shim (pyenv's: a
bash script that runs `pyenv exec`, about 0.1-0.2 s a start) would be charged to ours
alone, three times (submit's check, the chunk, each task's wrapper).

Each job is submitted on an idle cluster (_results.idle), and the scheduler starts it at
its next pass (bf_interval=2: 0 to 2 s after the submit, or the release of ours): the
section also gives each side's time less that wait, read from slurmctld's log, where the
sides' own work alone is compared."""

from __future__ import annotations

import datetime
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import idle, local_slurm, machine, median, short, write_section
from bench_submit import WORKLOAD, first_step

REPO = Path(__file__).resolve().parents[1]
STARTED = re.compile(r"launch started at unix time ([\d.]+)")
READY = re.compile(r"process group ready at unix time ([\d.]+)")
CTLD_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\dT[\d:.]+)\] (.*)")
ROUNDS = 16  # alternating rounds per mode (4 gave ratios 0.91 and 1.09 an hour apart, 8
# 1.059 and 1.145 for torchrun on one day)

HAND = {
    # one rank per srun task, the variables set by hand
    "tasks": "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
             "MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)); "
             "exec {py} -m train run {args}",
    # torchrun per node, static rendezvous written by hand
    "torchrun": "exec {py} -m torch.distributed.run --nnodes=2 --node-rank=$SLURM_NODEID "
                "--nproc-per-node=1 --master-addr=127.0.0.1 "
                "--master-port=$((20000 + SLURM_JOB_ID % 20000)) -m train run {args}",
}


def direct_python3(env: dict[str, str], folder: Path) -> dict[str, str]:
    """env with a folder first on PATH whose python3 is the interpreter PATH's python3
    runs (a link to it), not a shim in front of it."""
    found = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    folder.mkdir()
    (folder / "python3").symlink_to(found)
    return {**env, "PATH": f"{folder}{os.pathsep}{env['PATH']}"}


def queue_wait(cluster: Path, job_id: str) -> float | None:
    """Seconds from the job's submission (ours: its release) to its start, by the
    controller's log; None where the log does not say both."""
    log = cluster / "slurmctld.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    ready = start = None
    for match in CTLD_STAMP.finditer(text):
        line = match.group(2)
        if f"JobId={job_id} " not in line + " ":
            continue
        when = datetime.datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
        if "submit_batch_job" in line or "release hold" in line:
            ready = when
        elif "Started JobId" in line or "Allocate JobId" in line:
            start = when
    return start - ready if ready is not None and start is not None else None


def rendezvous(log_dir: Path) -> float:
    text = "".join(p.read_text(errors="replace") for p in log_dir.glob("*") if p.is_file())
    starts = [float(x) for x in STARTED.findall(text)]
    ready = [float(x) for x in READY.findall(text)]
    return max(ready) - min(starts)


def ours(work: Path, env: dict[str, str], mode: str, i: int
         ) -> tuple[float, float, str]:
    name = f"{mode}{i}"
    idle(env)
    start = time.time()
    subprocess.run([sys.executable, "-m", "train", "submit", "--name", name, "--cluster",
                    "local", "--python", sys.executable, "--nodes", "2", "--launch", mode,
                    "--cpus-per-task", "1", "--mem", "1000M", "--time", "5", "--",
                    *WORKLOAD], cwd=work, env=env, check=True, capture_output=True)
    logs = work / "runs" / name / "logs"
    step = first_step(logs) - start
    time.sleep(2)  # let the other rank's lines reach the log
    job_id = (work / "runs" / name / "chain.ids").read_text().split()[1]
    return step, rendezvous(logs), job_id


def hand(work: Path, env: dict[str, str], mode: str, i: int) -> tuple[float, str]:
    out = work / f"hand-{mode}{i}"
    out.mkdir()
    args = shlex.join([*WORKLOAD, "--out", str(out / "run")])
    inner = HAND[mode].format(py=shlex.quote(sys.executable), args=args)
    command = f"srun --cpus-per-task=1 bash -c {shlex.quote(inner)}"
    idle(env)
    start = time.time()
    job_id = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1",
         "--mem=1000M", "--time=5", f"--output={out}/job.out", f"--error={out}/job.err",
         "--wrap", command], cwd=work, env=env, check=True, capture_output=True,
        text=True).stdout.strip().split(";")[0]
    return first_step(out) - start, job_id


def main() -> None:
    rows: list[str] = []
    runs: list[str] = []
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp, local_slurm("tl") as (cluster_env, cluster):
        work = Path(tmp)
        env = direct_python3(cluster_env, work / "bin")
        for mode in ("tasks",) if short() else ("tasks", "torchrun"):  # (short: one mode)
            t_ours, t_hand, t_rdzv = [], [], []
            net: dict[str, list[float]] = {"ours": [], "hand": []}
            for i in range(1 if short() else ROUNDS):
                if i % 2:
                    o, r, o_job = ours(work, env, mode, i)
                    h, h_job = hand(work, env, mode, i)
                else:
                    h, h_job = hand(work, env, mode, i)
                    o, r, o_job = ours(work, env, mode, i)
                t_ours.append(o)
                t_hand.append(h)
                t_rdzv.append(r)
                for side, total, job in (("ours", o, o_job), ("hand", h, h_job)):
                    wait = queue_wait(cluster, job)
                    if wait is not None:
                        net[side].append(total - wait)
            less = "n/a | n/a | n/a"  # (a controller's log that does not say)
            if len(net["ours"]) == len(net["hand"]) == len(t_ours):
                less = (f"{median(net['ours']):.2f} | {median(net['hand']):.2f} | "
                        f"{median(net['ours']) / median(net['hand']):.3f}")
            rows.append(f"| {mode} | {median(t_rdzv):.2f} | {median(t_ours):.2f} | "
                        f"{median(t_hand):.2f} | {median(t_ours) / median(t_hand):.3f} | "
                        f"{less} |")
            runs.append(f"- {mode}: ours {', '.join(f'{t:.2f}' for t in t_ours)}; "
                        f"hand-written {', '.join(f'{t:.2f}' for t in t_hand)}")
    load.append(os.getloadavg()[0])
    body = "\n".join([
        "## train launch on 2 nodes (goal: <= 1.05x a hand-written srun job)",
        "",
        f"Machine: {machine()}; the local 2-node cluster of ci/slurm-up.sh, one CPU rank "
        f"per node, DDP over gloo. Median of {ROUNDS} alternating submissions each, timed "
        "from the submitting command's start to the first training step's log line, each "
        "submitted once the cluster is idle. "
        "Rendezvous = first task started to last rank's process group ready (ours). Ours: "
        "`train submit --nodes 2 --launch MODE` (its checks, held submit and release, the "
        "chain engine per chunk and per task, `train launch`); hand-written: `sbatch "
        "--wrap \"srun bash -c '...'\"` setting the rank variables (tasks) or calling "
        "torchrun with a static rendezvous (torchrun) by hand. The jobs' python3 is an "
        "interpreter, not a version manager's shim (see the script's docstring), and "
        "the train package's bytecode is compiled first, as an installed package's is "
        "(benchmarks/_results.py: local_slurm). Load "
        f"average (1 min) at the start and the end: {load[0]:.1f}, {load[1]:.1f} (other "
        "work on the machine slows both sides' runs alike, not their order).",
        "",
        "The last three columns take out each job's wait for the scheduler's pass (its "
        "submission, or ours' release, to its start in slurmctld's log): Slurm's, the "
        "same for both sides, and 0 to 2 s of noise in each run.",
        "",
        "| mode | rendezvous s | ours: submit to first step s | hand-written s | ratio | "
        "ours less queue wait s | hand-written less queue wait s | ratio |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Each run, in seconds:",
        "",
        *runs,
    ])
    write_section("launch", body)


if __name__ == "__main__":
    main()
