"""Chains on the local SLURM cluster: submitting, watching and killing them, shared by the
slurm tier's tests (which check what happens) and benchmarks/bench_chain.py (which times
it). Work is counted, never sized from a speed: chunks are ended by signals sent when a
given number of episodes is checkpointed, or by work that cannot finish (10**6 episodes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli, tiny_flags

TERMINAL = {"complete", "failed", "cancelled", "incomplete", "stalled", "ended"}
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED",
          "REQUEUE_HOLD", "RESIZING", "SIGNALING"}
ENDLESS = ["demo", "--episodes", "1000000", *tiny_flags(checkpoint_every=25)]


class ChainError(AssertionError):
    pass


def job_flags(*flags: str) -> list[str]:
    return ["--cluster", "local", "--python", sys.executable, "--cpus-per-task", "1",
            "--mem", "1000M", *flags]


def submit(cwd: Path, env: dict[str, str], name: str, flags: list[str],
           workload: list[str]) -> Path:
    proc = run_cli(["submit", "--name", name, *job_flags(*flags), "--", *workload], cwd=cwd,
                   env=env)
    if proc.returncode != 0 or f"submitted {name}" not in proc.stdout:
        raise ChainError(f"submit failed ({proc.returncode}): {proc.stderr}")
    return cwd / "runs" / name


def status(cwd: Path, env: dict[str, str], ref: str) -> dict[str, Any]:
    proc = run_cli(["status", ref, "--json"], cwd=cwd, env=env)
    if proc.returncode != 0:
        raise ChainError(f"status failed: {proc.stderr}")
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def logs(run_dir: Path, suffix: str = "err") -> str:
    return "".join(p.read_text(errors="replace")
                   for p in sorted((run_dir / "logs").glob(f"*.{suffix}")))


def engine_report(run_dir: Path) -> str:
    """What the engine wrote of a chain: its events and the logs' last 40 lines."""
    record = run_dir / "chain.events"
    events = record.read_text(errors="replace") if record.exists() else "(none)\n"
    return f"--- chain.events\n{events}" + "".join(
        f"--- *.{kind}, last 40 lines\n" + "".join(logs(run_dir, kind).splitlines(True)[-40:])
        for kind in ("err", "out"))


def assert_complete(st: dict[str, Any], run_dir: Path) -> None:
    """The chain completed; else a failure that opens with what the engine wrote (its
    events, the logs' last lines), whole, where a report shows only a failure's start."""
    if st["state"] != "complete":
        pytest.fail(f"chain {run_dir.name} ended {st['state']}, not complete\n"
                    f"{engine_report(run_dir)}--- status\n{json.dumps(st, indent=1)[:3000]}",
                    pytrace=False)


def settled(st: dict[str, Any]) -> bool:
    """The chain reached a final state and nothing of it is queued or running."""
    return st["state"] in TERMINAL and all(c["state"] not in ACTIVE for c in st["chunks"])


def wait(cwd: Path, env: dict[str, str], ref: str, until: Callable[[dict[str, Any]], bool],
         timeout: float = 240, poll: float = 0.5) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        st = status(cwd, env, ref)
        if until(st):
            return st
        if time.monotonic() > deadline:
            # (status gives the run folder relative to where it was asked)
            raise ChainError(f"timed out waiting on {ref}: {json.dumps(st, indent=1)}\n"
                             f"{engine_report(cwd / st['run_dir'])}")
        time.sleep(poll)


def checkpointed(run_dir: Path, seed: int = 4) -> int:
    """The newest complete checkpoint's episode (0 when none)."""
    names = [p.name for p in (run_dir / f"seed_{seed}" / "checkpoints").glob("ckpt-*.pt")]
    found = [int(m.group(1)) for n in names if (m := re.match(r"ckpt-(\d+)\.pt$", n))]
    return max(found, default=0)


def running_chunk(cwd: Path, env: dict[str, str], name: str, chunk: int,
                  min_episode: int = 0, timeout: float = 180) -> dict[str, Any]:
    """Wait until `chunk` runs and the run has checkpointed at least `min_episode`."""
    run_dir = cwd / "runs" / name

    def ready(st: dict[str, Any]) -> bool:
        mine = [c for c in st["chunks"] if c["chunk"] == chunk]
        return bool(mine) and mine[0]["state"] == "RUNNING" \
            and "started" in mine[0]["events"] and checkpointed(run_dir) >= min_episode

    st = wait(cwd, env, name, ready, timeout=timeout, poll=0.2)
    found: dict[str, Any] = next(c for c in st["chunks"] if c["chunk"] == chunk)
    return found


def slurm(argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60, check=False)
    if proc.returncode != 0:
        raise ChainError(f"{' '.join(argv)} failed: {proc.stderr}")
    return proc.stdout


def walltime_signal(job_id: str, env: dict[str, str]) -> None:
    """What `--signal=B:USR1@N` does at the margin: USR1 to the batch shell only."""
    slurm(["scancel", "--batch", "--signal=USR1", job_id], env)


def node_of(job_id: str, env: dict[str, str]) -> str:
    return slurm(["squeue", "-h", "-j", job_id, "-o", "%N"], env).strip()


def _descendants(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def fail_node(conf_dir: Path, node: str, job_id: str) -> None:
    """A node dies: its slurmd and everything the job runs there are killed at once (on
    this one-machine cluster the job's processes are the job's slurmstepd trees)."""
    slurmd = int((conf_dir / f"slurmd-{node}.pid").read_text().strip())
    steps = [int(p) for p in subprocess.run(
        ["pgrep", "-f", rf"slurmstepd: \[{job_id}\."], capture_output=True, text=True,
        check=False).stdout.split()]
    for pid in _descendants([slurmd, *steps]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def restart_node(conf_dir: Path, node: str, env: dict[str, str]) -> None:
    """Start the node's slurmd again and wait until it takes jobs (ReturnToService=2)."""
    # (its command line names the cluster's folder, as ci/slurm-up.sh starts it: what
    # ci/slurm-down.sh finds if it is left; on the trixie cluster PATH gives its slurmd)
    subprocess.run(["slurmd", "-N", node, "-f", env["SLURM_CONF"]], env={**os.environ, **env},
                   check=True, timeout=60)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = slurm(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], env).strip()
        if state.startswith("idle") or state.startswith("mix") or \
                state.startswith("alloc"):
            return
        time.sleep(0.5)
    raise ChainError(f"node {node} did not return to service: {state}")


def conf_dir(env: dict[str, str]) -> Path:
    return Path(env["SLURM_CONF"]).parent


def kill_wait(env: dict[str, str]) -> int:
    text = (conf_dir(env) / "slurm.conf").read_text()
    match = re.search(r"^KillWait=(\d+)$", text, re.M)
    return int(match.group(1)) if match else 30


# -- the deaths of a chunk ------------------------------------------------------------
@dataclass
class Death:
    at: float  # when the chunk died: our action, or the end Slurm recorded for it
    settled_at: float  # when `train status` first showed the final state, nothing queued
    status: dict[str, Any]


def _settle(cwd: Path, env: dict[str, str], name: str, at: float, timeout: float = 240
            ) -> Death:
    st = wait(cwd, env, name, settled, timeout=timeout, poll=0.2)
    return Death(at, time.time(), st)


def death_timeout(cwd: Path, env: dict[str, str], name: str) -> Death:
    """A step that ignores USR1 and TERM runs into its walltime (1 minute)."""
    stubborn = cwd / "stubborn.sh"
    stubborn.write_text("#!/bin/bash\ntrap '' USR1 TERM\nexec sleep 100000\n")
    stubborn.chmod(0o755)
    submit(cwd, env, name, ["--python", str(stubborn), "--time", "1", "--max-chunks", "3"],
           ["demo"])
    job = wait(cwd, env, name, lambda s: len(s["chunks"]) >= 2)["chunks"][0]
    death = _settle(cwd, env, name, 0.0)
    death.at = _job_time(job["job_id"], env, "EndTime")  # Slurm's own TIMEOUT
    return death


def death_scancel(cwd: Path, env: dict[str, str], name: str) -> Death:
    submit(cwd, env, name, ["--time", "10", "--max-chunks", "3"], ENDLESS)
    job = running_chunk(cwd, env, name, 1, min_episode=25)
    now = time.time()
    slurm(["scancel", job["job_id"]], env)
    return _settle(cwd, env, name, now)


def death_kill_step(cwd: Path, env: dict[str, str], name: str) -> Death:
    submit(cwd, env, name, ["--time", "10", "--max-chunks", "3"], ENDLESS)
    job = running_chunk(cwd, env, name, 1, min_episode=25)
    now = time.time()
    slurm(["scancel", "--signal=KILL", f"{job['job_id']}.0"], env)
    return _settle(cwd, env, name, now)


def death_node_failure(cwd: Path, env: dict[str, str], name: str) -> Death:
    submit(cwd, env, name, ["--time", "10", "--max-chunks", "3"], ENDLESS)
    job = running_chunk(cwd, env, name, 1, min_episode=25)
    node = node_of(job["job_id"], env)
    fail_node(conf_dir(env), node, job["job_id"])
    try:
        death = _settle(cwd, env, name, 0.0, timeout=180)
        # Slurm's NODE_FAIL, SlurmdTimeout after the node fell silent
        death.at = _job_time(job["job_id"], env, "EndTime")
    finally:
        restart_node(conf_dir(env), node, env)
    return death


def death_requeue(cwd: Path, env: dict[str, str], name: str) -> Death:
    """Requeue mode: Slurm requeues the running job (as a site's preemption does); it comes
    back, resumes, and the chain ends when `train cancel` stops it."""
    submit(cwd, env, name, ["--requeue", "--time", "10", "--max-chunks", "3"], ENDLESS)
    job = running_chunk(cwd, env, name, 1, min_episode=25)
    first = checkpointed(cwd / "runs" / name)
    now = time.time()
    slurm(["scontrol", "requeue", job["job_id"]], env)
    run_dir = cwd / "runs" / name
    wait(cwd, env, name, lambda s: "resumed at episode" in logs(run_dir), timeout=240,
         poll=0.2)
    back = time.time()  # running again from its checkpoint: the "settled" time here
    wait(cwd, env, name, lambda s: checkpointed(run_dir) > first, timeout=240)
    proc = run_cli(["cancel", name], cwd=cwd, env=env)
    if proc.returncode != 0:
        raise ChainError(proc.stderr)
    death = _settle(cwd, env, name, now)
    death.settled_at = back
    return death


def _job_time(job_id: str, env: dict[str, str], key: str) -> float:
    text = slurm(["scontrol", "show", "job", job_id], env)
    match = re.search(rf"\b{key}=(\S+)", text)
    if not match:
        raise ChainError(f"no {key} for job {job_id}")
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))


DEATHS = {"timeout": death_timeout, "scancel": death_scancel, "kill-step": death_kill_step,
          "node-failure": death_node_failure, "requeue": death_requeue}
