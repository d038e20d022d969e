"""Time in the queue: a chain whose chunks fit the scheduler's holes (the default floor,
`--time-min`) against the same chain with fixed chunks (`--time-min off`), on the local
SLURM cluster made busy like a site; from submit to the chain's end. Goal: at most 0.8x.

The scenario, built anew for each chain at the same offsets from its submit: another
user's job holds node n1 for 5 minutes; a bigger job (both nodes, 1 minute) waits behind
it, so the backfill keeps n2 free only until n1 is: a hole of 5 minutes, too short for a
6-minute chunk; then a maintenance reservation (MAINT, all nodes, 1 minute) 11 minutes
after the submit: a hole of about 5 minutes after the bigger job, again too short. The
tests run as root, the cluster's SlurmUser, so the other users' jobs are root's jobs told
apart by their names (site-a, site-b); they do nothing but sleep their length.

The chain: `train submit --entry command -t 6 --signal-margin 30 --max-chunks 4` of
tests/integration/plain_steps.py, 72 steps of 5 seconds each (USER_STEP_SECONDS: a step
of a known length, so that a chunk does work for as long as it runs and a short chunk
does less; the work is counted in steps, never sized from a speed). Each chunk works
until its stop signal, saves, and the next chunk goes on from the save; the chain ends
when the 72nd step is done.

The full run starts two clusters side by side (ci/slurm-up.sh), one per chain, and
submits both chains into their scenarios at once: both wait out the same minutes, so the
run takes about 20 minutes, not 35. The short mode (CI's, on the tier's cluster) runs the
same code on a scenario that leaves no hole to wait for (the other users' jobs sleep a
second, the maintenance is half an hour away) and two steps of one second: about a
minute, and no figure of it means anything. Every reservation and job the benchmark makes
is removed by it, also when it fails.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))
from tests.conftest import run_cli  # noqa: E402
from tests.integration import localslurm  # noqa: E402
from tests.integration.chains import (  # noqa: E402
    ChainError,
    conf_dir,
    settled,
    slurm,
    submit,
    wait,
)

from _results import local_slurm, machine, short, write_section  # noqa: E402
from train.batch import contract  # noqa: E402
from train.client.slurm.chain import parse_events  # noqa: E402

PLAIN = REPO / "tests" / "integration" / "plain_steps.py"


@dataclass(frozen=True)
class Blocker:
    """Another user's job: sbatch options for where it runs, its time limit in minutes and
    how long it sleeps (its known length)."""

    name: str
    where: tuple[str, ...]
    nodes: str
    minutes: int
    seconds: int


@dataclass(frozen=True)
class Scenario:
    minutes: int  # the chain's -t
    margin: int  # --signal-margin, seconds
    steps: int  # the work
    step_seconds: float
    max_chunks: int
    blockers: tuple[Blocker, ...]
    maint_after: int  # seconds from the scenario's making to the maintenance
    maint_minutes: int
    timeout: float  # for the chain to end


FULL = Scenario(
    minutes=6, margin=30, steps=72, step_seconds=5.0, max_chunks=4,
    blockers=(Blocker("site-a", ("--nodelist=n1", "--nodes=1"), "n1", 5, 5 * 60 - 5),
              Blocker("site-b", ("--nodes=2",), "n1, n2", 1, 60 - 5)),
    maint_after=660, maint_minutes=1, timeout=1800)
SHORT = Scenario(
    minutes=2, margin=15, steps=2, step_seconds=1.0, max_chunks=2,
    blockers=(Blocker("site-a", ("--nodelist=n1", "--nodes=1"), "n1", 1, 1),
              Blocker("site-b", ("--nodes=2",), "n1, n2", 1, 1)),
    maint_after=1800, maint_minutes=1, timeout=300)

# (label, the chain's --time-min flags)
CHAINS = (("default", []), ("fixed chunks", ["--time-min", "off"]))


@dataclass
class Busy:
    made: float  # when the scenario was made (Unix time)
    reservation: str
    maint_start: float
    jobs: dict[str, str]  # blocker name -> job id


@contextlib.contextmanager
def busy_cluster(sc: Scenario, env: dict[str, str], tag: str) -> Iterator[Busy]:
    """The other users' jobs and the maintenance, removed afterwards however it ends."""
    busy = Busy(time.time(), f"bench_maint_{tag}", 0.0, {})
    busy.maint_start = busy.made + sc.maint_after
    try:
        slurm(["scontrol", "create", "reservation", f"ReservationName={busy.reservation}",
               "StartTime=" + time.strftime("%Y-%m-%dT%H:%M:%S",
                                            time.localtime(busy.maint_start)),
               f"Duration={sc.maint_minutes}", "Nodes=ALL", "Users=root",
               "Flags=MAINT,IGNORE_JOBS"], env)
        for b in sc.blockers:  # in this order: site-b queues behind site-a
            out = slurm(["sbatch", "--parsable", f"--job-name={b.name}", "--exclusive",
                         *b.where, f"--time={b.minutes}", "--output=/dev/null",
                         f"--wrap=sleep {b.seconds}"], env)
            busy.jobs[b.name] = out.strip().split(";")[0]
        yield busy
    finally:
        removals = [["scontrol", "delete", f"ReservationName={busy.reservation}"]]
        if busy.jobs:
            removals.insert(0, ["scancel", *busy.jobs.values()])
        for argv in removals:  # (a job that ended, a reservation that passed: no matter)
            subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)


def unix(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def blocker_times(env: dict[str, str], jobs: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Start and end of each ended job, from the cluster's job completion file."""
    found = {}
    for line in (conf_dir(env) / "jobcomp.txt").read_text().splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        for name, job in jobs.items():
            if fields.get("JobId") == job:
                found[name] = (unix(fields["StartTime"]), unix(fields["EndTime"]))
    return found


def chunk_figures(run_dir: Path) -> tuple[float, list[dict[str, Any]]]:
    """The chain's submit time and, per chunk, the times the contract names: submitted
    (chunk 1: chain.json's; later: its predecessor's `extended` event), eligible (the later
    of that and the predecessor's end: it waits on the predecessor's success), started, its
    time limit (the `limit` event, else the job record's walltime) and its end (its last
    event)."""
    record = json.loads((run_dir / contract.CHAIN_RECORD).read_text())
    submitted = datetime.strptime(record["submitted"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    events = parse_events((run_dir / contract.CHAIN_EVENTS).read_text())
    chunks: list[dict[str, Any]] = []
    for number in sorted({e["chunk"] for e in events if e["chunk"] > 0}):
        mine = [e for e in events if e["chunk"] == number]
        by_name = {e["event"]: e for e in mine}
        limit = by_name.get(contract.EV_LIMIT)
        prev = chunks[-1] if chunks else None
        sub = prev["extended"] if prev else submitted
        chunks.append({
            "chunk": number, "job": mine[0]["job_id"], "submitted": sub,
            "eligible": max(sub, prev["end"]) if prev else sub,
            "started": by_name[contract.EV_STARTED]["time"],
            "limit": int(limit["detail"].split()[0]) if limit
            else int(record["job"]["walltime_seconds"]),
            "end": mine[-1]["time"], "how": mine[-1]["event"],
            "extended": by_name[contract.EV_EXTENDED]["time"]
            if contract.EV_EXTENDED in by_name else None})
    return submitted, chunks


def run_chain(sc: Scenario, env: dict[str, str], work: Path, tag: str,
              flags: list[str]) -> dict[str, Any]:
    """One chain in a scenario of its own; its figures."""
    (work / PLAIN.name).write_bytes(PLAIN.read_bytes())
    with busy_cluster(sc, env, tag) as busy:
        run_dir = submit(work, env, tag, [
            "--entry", "command", "--time", str(sc.minutes), *flags,
            "--signal-margin", str(sc.margin), "--stop-signal", "USR1",
            "--max-chunks", str(sc.max_chunks), "--env", f"USER_STEPS={sc.steps}",
            "--env", f"USER_STEP_SECONDS={sc.step_seconds:g}"],
            [sys.executable, str(work / PLAIN.name)])
        st: dict[str, Any] = {}
        try:
            st = wait(work, env, tag, settled, timeout=sc.timeout, poll=3)
        finally:
            if not st:  # (a chain that did not end is ended with its scenario)
                run_cli(["cancel", tag], cwd=work, env=env, timeout=120)
        if st["state"] != "complete":
            raise ChainError(f"chain {tag} ended {st['state']}: {json.dumps(st)[-2000:]}")
        record = json.loads((run_dir / contract.CHAIN_RECORD).read_text())
        submitted, chunks = chunk_figures(run_dir)
        return {"submitted": submitted, "chunks": chunks, "busy": busy,
                "floor": int(record["job"].get("time_min_seconds", 0)),
                "blockers": blocker_times(env, busy.jobs)}


def slurm_version(env: dict[str, str]) -> str:
    return slurm(["sinfo", "--version"], env).strip()


def section(sc: Scenario, version: str, runs: list[dict[str, Any]]) -> str:
    ends = [max(c["end"] for c in r["chunks"]) - r["submitted"] for r in runs]
    ratio = ends[0] / ends[1]
    rows, chunk_rows, scene_rows = [], [], []
    for (label, _), run, end in zip(CHAINS, runs, ends, strict=True):
        t0 = run["submitted"]
        waited = sum(c["started"] - c["eligible"] for c in run["chunks"])
        ran = sum(c["end"] - c["started"] for c in run["chunks"])
        floor = f"floor {run['floor'] // 60} min" if run["floor"] else "--time-min off"
        rows.append(f"| {label} ({floor}) | {end:.0f} | {len(run['chunks'])} | "
                    f"{waited:.0f} | {ran:.0f} |")
        for c in run["chunks"]:
            chunk_rows.append(
                f"| {label} | {c['chunk']} | {c['job']} | {c['submitted'] - t0:.0f} | "
                f"{c['eligible'] - t0:.0f} | {c['started'] - t0:.0f} | "
                f"{c['started'] - c['eligible']:.0f} | {c['limit']} | {c['end'] - t0:.0f} | "
                f"{c['how']} |")
        for b in sc.blockers:
            start, stop = run["blockers"].get(b.name, (float("nan"), float("nan")))
            scene_rows.append(f"| {label} | {b.name} ({b.nodes}) | {b.minutes} min | "
                              f"{start - t0:.0f} | {stop - t0:.0f} |")
        maint = run["busy"].maint_start
        scene_rows.append(f"| {label} | maintenance (MAINT, all nodes) | "
                          f"{sc.maint_minutes} min | {maint - t0:.0f} | "
                          f"{maint + 60 * sc.maint_minutes - t0:.0f} |")
    verdict = "Short mode: no figure here is a measurement" if short() else \
        "Goal met" if ratio <= 0.8 else "Goal NOT met"
    return "\n".join([
        "## Queue time: chunks that fit the holes (default --time-min) against fixed chunks "
        "(goal: <= 0.8x the time from submit to the chain's end)",
        "",
        f"Machine: {machine()}; the local SLURM cluster of ci/slurm-up.sh ({version}, "
        "2 nodes of 4 CPUs, sched/backfill, bf_interval=2)" + (
            "; short mode: a scenario with no hole to wait for" if short() else
            "; two such clusters side by side, one per chain, both chains submitted at "
            "once into the same scenario") + ".",
        "",
        f"The chain: `train submit --entry command -t {sc.minutes} --signal-margin "
        f"{sc.margin} --max-chunks {sc.max_chunks}` of tests/integration/plain_steps.py, "
        f"{sc.steps} steps of {sc.step_seconds:g} s (each chunk works until its stop signal, "
        "saves, and the next goes on from the save), with the default floor against "
        "`--time-min off`. Other users' jobs (the tests run as root: told apart by name) "
        "sleep their known length; the maintenance is a MAINT reservation of all nodes. "
        "Seconds from the chain's submit (chain.json); events from chain.events.",
        "",
        "| chain | submit to end s | chunks | waited s | ran s |",
        "|---|---|---|---|---|",
        *rows,
        f"| ratio | {ratio:.2f}x | | | |",
        "",
        f"{verdict}. Per chunk: submitted (chunk 1: the chain's submit; later: when its "
        "predecessor submitted it, at its start), eligible (its predecessor's end: it runs "
        "after that one's success), waited = started - eligible, limit = the time limit "
        "Slurm started it with (the engine's `limit` event; the job's -t where the floor is "
        "off):",
        "",
        "| chain | chunk | job | submitted | eligible | started | waited | limit s | ended | "
        "last event |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *chunk_rows,
        "",
        "The scenario as it ran (seconds from each chain's submit; the other users' jobs "
        "from the job completion file):",
        "",
        "| chain | job | time limit | started | ended |",
        "|---|---|---|---|---|",
        *scene_rows,
    ])


def main() -> None:
    sc = SHORT if short() else FULL
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        # the full run: a cluster per chain, side by side, of the Slurm TRAIN_TEST_SLURM
        # names (the sites run 23.x-25.x: 24.11; 22.05 starts every floor job short, and
        # there the default floor is off); the short mode: CI's, in turn
        if short():
            envs = [stack.enter_context(local_slurm("tq0"))[0]]
        else:
            envs = [stack.enter_context(localslurm.local_cluster(
                localslurm.selected(), f"tq{i}", session_path=False)) for i in
                range(len(CHAINS))]
        version = slurm_version(envs[0])

        def one(i: int) -> dict[str, Any]:
            work = tmp / f"c{i}"
            work.mkdir()
            return run_chain(sc, envs[i % len(envs)], work, f"q{i}", CHAINS[i][1])

        if short():
            runs = [one(i) for i in range(len(CHAINS))]
        else:
            with ThreadPoolExecutor(len(CHAINS)) as pool:
                runs = list(pool.map(one, range(len(CHAINS))))
    write_section("queue", section(sc, version, runs))


if __name__ == "__main__":
    main()
