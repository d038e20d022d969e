"""Maintenance reservations (train.client.slurm.reservations): the parser on real
`scontrol show reservation -o` output, the note `train submit` gives, and the words
`train status` gives a chunk that waits for one.

slurm_output/reservations-VERSION.txt: captured on the local clusters of the slurm tier
(tests/integration/localslurm.py: the machine's 22.05, 24.11 and 26.05 in their roots),
as root (the clusters' SlurmUser): `scontrol create reservation` of maint_all (StartTime=
now+3minutes Duration=120 Nodes=ALL Flags=MAINT), maint_n2 (now+2days, 1 day, Nodes=n2,
Flags=MAINT,IGNORE_JOBS) and course (now+1days, 60 min, PartitionName=debug NodeCnt=1, no
flag), then `scontrol show reservation -o`; on a fresh cluster maint_now (StartTime=now,
MAINT, so ACTIVE) and later (now+1days, Nodes=n1), the same command; and its answer with
none ('No reservations in the system'). A job of -t 10 submitted behind maint_all (and
behind maint_now) waited with squeue's %r "ReqNodeNotAvail, Reserved for maintenance"
(--json: state_reason "ReqNodeNotAvail", state_description that text) on all three
versions; a job for its own future reservation waited with "Reservation".
"""

from __future__ import annotations

import calendar
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from train.batch import contract
from train.client.slurm import chain as slurm_chain
from train.client.slurm import chainstatus, queue, reservations

OUTPUT = Path(__file__).parent / "slurm_output"
VERSIONS = ("22.05", "24.11", "26.05")
MAINT_REASON = "ReqNodeNotAvail, Reserved for maintenance"


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """scontrol printed the clusters' local time, UTC; status asks for the reservations
    once a command (a cache this test's stand-ins must not outlive)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    reservations._known.cache_clear()
    yield
    monkeypatch.undo()
    time.tzset()
    reservations._known.cache_clear()


def _captured(version: str) -> list[reservations.Reservation]:
    return reservations.parse_reservations((OUTPUT / f"reservations-{version}.txt")
                                           .read_text())


def _field(version: str, name: str, key: str) -> str:
    line = next(x for x in (OUTPUT / f"reservations-{version}.txt").read_text().splitlines()
                if x.startswith(f"ReservationName={name} "))
    return line.split(f" {key}=")[1].split()[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_each_versions_reservations_are_read(version: str) -> None:
    found = {r.name: r for r in _captured(version)}
    assert sorted(found) == ["course", "later", "maint_all", "maint_n2", "maint_now"]
    for name, resv in found.items():
        for key, got in (("StartTime", resv.start), ("EndTime", resv.end)):
            assert got == calendar.timegm(time.strptime(_field(version, name, key),
                                                        "%Y-%m-%dT%H:%M:%S")), (name, key)
    assert found["maint_all"].end - found["maint_all"].start == 2 * 3600
    assert found["maint_n2"].end - found["maint_n2"].start == 24 * 3600
    assert [n for n, r in found.items() if r.maintenance] == ["maint_all", "maint_n2",
                                                                 "maint_now"]
    assert found["maint_all"].nodes == "n[1-2]" and found["maint_n2"].nodes == "n2"
    assert "ALL_NODES" in found["maint_all"].flags and found["course"].flags == ()


def test_no_reservation_and_a_time_that_does_not_read() -> None:
    assert reservations.parse_reservations("No reservations in the system\n") == []
    line = (OUTPUT / "reservations-24.11.txt").read_text().splitlines()[0]
    with pytest.raises(ValueError, match=r"line 1: StartTime 'Unknown' is not a time"):
        reservations.parse_reservations(line.replace(
            line.split(" StartTime=")[1].split()[0], "Unknown", 1))


def test_a_comment_naming_keys_leaves_slurms_own_fields() -> None:
    """A reservation's Comment is free text, printed last: words in it that read as keys
    (an admin's "Flags=NONE until confirmed") are no fields of the reservation."""
    line = (OUTPUT / "reservations-24.11.txt").read_text().splitlines()[0]
    resv, = reservations.parse_reservations(
        line + " Comment=GPU firmware; Nodes=gpu nodes only Flags=NONE until confirmed")
    assert resv.maintenance and resv.nodes == "n[1-2]", resv


def test_the_maintenances_ahead_are_those_that_overlap_the_span() -> None:
    found = {r.name: r for r in _captured("22.05")}
    start = found["maint_all"].start
    assert [r.name for r in reservations.ahead(found.values(), start - 60, start + 60)] == \
        ["maint_now", "maint_all"]  # (course is no maintenance)
    after = found["maint_now"].end  # (it ends then)
    assert [r.name for r in reservations.ahead(found.values(), after, float("inf"))] == \
        ["maint_all", "maint_n2"]


def _job(minutes: int, chunks: int, floor_minutes: int = 0) -> Any:
    return SimpleNamespace(minutes=minutes, chunks=chunks, partition="debug",
                           time_min=floor_minutes)


def _site(tmp_path: Path, scontrol: str, sinfo: str = "") -> dict[str, str]:
    """A PATH holding stand-ins for scontrol and sinfo (shell scripts)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("scontrol", scontrol), ("sinfo", sinfo)):
        if body:
            (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": str(bin_dir)}


def test_submit_says_when_the_maintenance_is_and_what_the_chain_will_do(
        tmp_path: Path) -> None:
    # the first capture's reservations (maint_now was made on a cluster of its own)
    fixture = f"/bin/grep -v maint_now {OUTPUT / 'reservations-26.05.txt'}"
    found = {r.name: r for r in _captured("26.05")}
    # sinfo lists the partition's nodes among a reservation's (n2 is debug's)
    env = _site(tmp_path, fixture, 'echo "$@" | /bin/grep -q -- "-n n2 -p debug" && '
                'echo n2; exit 0')
    now = found["maint_all"].start - 600
    off = reservations.submit_notes(_job(60, 1), env, now=now)  # one chunk: it waits
    assert len(off) == 1 and "maint_all on nodes n[1-2], from 2026-11-29 11:08 UTC (in " \
        "about 10 min) to 2026-11-29 13:08 UTC" in off[0], off
    assert "a chunk whose --time crosses it does not start until it ends (2026-11-29 " \
           "13:08 UTC): it may wait up to 2.2 h" in off[0], off
    # a chain of 60 chunks of an hour: maint_n2 (2 days ahead, on n2 of debug) too
    chain = reservations.submit_notes(_job(60, 60, floor_minutes=15), env, now=now)
    assert [n.split()[3] for n in chain] == ["maint_all", "maint_n2"], chain
    assert "at most 60 x --time 01:00:00, queue waits not counted" in chain[0]
    assert "a chunk may start shorter than --time (down to its floor, --time-min 00:15:00) " \
           "so as to end before it, stops at its stop signal with a save, and the next " \
           "chunk goes on after the maintenance" in chain[0], chain
    # nodes outside the job's partition: nothing said
    env = _site(tmp_path, fixture, "exit 0")
    assert [n.split()[3] for n in reservations.submit_notes(_job(60, 60), env, now=now)] \
        == ["maint_all"]


def test_a_maintenance_under_way_is_not_said_to_leave_a_hole_before_it() -> None:
    """Under way, no chunk ends before it: a chain with a floor waits as any job does."""
    found = {r.name: r for r in _captured("24.11")}
    resv = found["maint_now"]
    said = reservations.note(resv, now=resv.start + 600, walltime=3600, chunks=5, floor=900)
    assert "(under way)" in said and "may start shorter" not in said, said
    assert f"does not start until it ends ({reservations.at(resv.end)}): it may wait up " \
           "to 0.3 h" in said, said


@pytest.mark.parametrize("scontrol", ["", "echo 'slurm_load_reservations: Unable to "
                                      "contact slurm controller' >&2; exit 1",
                                      "echo 'ReservationName=x StartTime=soon'"])
def test_submit_says_nothing_where_scontrol_is_missing_fails_or_is_unread(
        tmp_path: Path, scontrol: str) -> None:
    assert reservations.submit_notes(_job(60, 4), _site(tmp_path, scontrol), now=0) == []


def test_squeue_json_gives_the_reason_as_squeue_prints_it() -> None:
    # 24.11's answer for a job behind maint_all, as captured (its other fields left out)
    text = json.dumps({"jobs": [
        {"job_id": 12096, "job_state": ["PENDING"], "state_reason": "ReqNodeNotAvail",
         "state_description": MAINT_REASON,
         "start_time": {"set": True, "infinite": False, "number": 1795957665}},
        {"job_id": 12097, "job_state": ["PENDING"], "state_reason": "Reservation",
         "state_description": ""}]})
    got = queue.parse_squeue_json(text)
    assert got["12096"]["reason"] == MAINT_REASON
    assert got["12097"]["reason"] == "Reservation"


def test_a_chunk_behind_a_maintenance_is_said_with_its_name_and_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = {r.name: r for r in _captured("24.11")}
    resv = found["maint_all"]
    run = tmp_path / "run"
    run.mkdir()
    (run / contract.CHAIN_RECORD).write_text(json.dumps(
        {"name": "m1", "cluster": "local", "max_chunks": 3, "walltime_seconds": 600}))
    (run / contract.CHAIN_IDS).write_text("1 10\n")
    (run / contract.CHAIN_EVENTS).write_text("")
    monkeypatch.setattr(queue, "job_states", lambda ids: {"10": {
        "state": "PENDING", "reason": MAINT_REASON, "start": resv.end}})
    asked = []
    monkeypatch.setattr(reservations, "read", lambda environ=None: asked.append(1) or list(
        found.values()))
    monkeypatch.setattr(time, "time", lambda: resv.start - 120)
    st = chainstatus.chain_status(slurm_chain.load_chain(run))
    # asked once a command (a sweep's tasks wait for the same maintenance)
    assert chainstatus.chain_status(slurm_chain.load_chain(run))["chunks"] == st["chunks"]
    assert len(asked) == 1
    assert st["chunks"][0]["maintenance"] == "maint_all (until 2026-11-29 13:07 UTC)"
    lines = chainstatus.format_status(st)
    assert "    waiting: the site's maintenance maint_all (until 2026-11-29 13:07 UTC) " \
           "holds the nodes it needs and its time limit crosses it: Slurm starts it once " \
           "the maintenance ends (nothing to do: the chain goes on then)" in lines, lines


def test_the_reasons_behind_a_reservation_in_words() -> None:
    assert "maintenance reservation holds the nodes" in str(queue.words(MAINT_REASON))
    # a maintenance of some of the job's nodes, as squeue said it on all three versions
    other = "ReqNodeNotAvail, May be reserved for other job"
    assert queue.is_reserved(other) and queue.is_reserved(MAINT_REASON)
    assert "a reservation (not the job's) holds nodes it needs" in str(queue.words(other))
    assert "maintenance m1 (until X) holds the nodes" in str(queue.words(other, "m1 (until X)"))
    assert queue.words("ReqNodeNotAvail, UnavailableNodes:n1") == \
        queue.WORDS["ReqNodeNotAvail"]
    assert queue.words("Reservation") == queue.WORDS["Reservation"]


def test_probe_shows_the_maintenances_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    from train.client.clusters.probe.command import facts
    from train.client.clusters.probe.site import Site

    found = _captured("22.05")
    monkeypatch.setattr(time, "time", lambda: next(r for r in found
                                                   if r.name == "maint_now").end)
    lines = [x for x in facts(Site(reservations=found)) if x.startswith("maintenance:")]
    assert [x.split()[1] for x in lines] == ["maint_all", "maint_n2"], lines
    assert lines[1] == ("maintenance: maint_n2 on nodes n2, from 2026-12-01 11:04 UTC (in "
                        "about 47.5 h) to 2026-12-02 11:04 UTC  (scontrol show reservation)")
    assert [x for x in facts(Site(reservations=[])) if x.startswith("maintenance:")] == \
        ["maintenance: none ahead  (scontrol show reservation)"]


SBATCH_UNTIL_AFTER = """#!/bin/sh
# --test-only refuses now, and accepts the job asked to begin after the maintenance
case " $* " in
  *" --test-only --begin="*) echo "sbatch: Job 1 to start at $3 using 2 processors" >&2; exit 0;;
  *" --test-only "*) echo 'sbatch: error: Batch job submission failed: Requested node \
configuration is not available' >&2; exit 1;;
esac
echo 'sbatch: error: no cluster in unit tests' >&2
exit 1
"""


def test_a_job_slurms_test_refuses_only_for_a_maintenance_is_queued_with_a_note(
        tmp_path: Path) -> None:
    """Slurm 22.05 to 26.05 refuse `sbatch --test-only` of a job that needs a node a
    maintenance holds during its time ("Requested node configuration is not available":
    seen on the local clusters with a MAINT reservation of n1, active or 3 minutes ahead,
    and a job of both nodes), where sbatch queues it to wait: submit refused it (exit 2,
    blaming its GPUs)."""
    from tests.conftest import run_cli
    from tests.unit.test_submit_checks import LOCAL, _exe

    line = (OUTPUT / "reservations-22.05.txt").read_text().splitlines()[1]  # maint_n2
    now = time.time()
    for key, at in (("StartTime", now + 180), ("EndTime", now + 1980)):
        line = line.replace(line.split(f" {key}=")[1].split()[0],
                            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at)))
    fake = tmp_path / "fake"
    _exe(fake / "scontrol", f"#!/bin/sh\necho '{line}'\n")
    _exe(fake / "sinfo", '#!/bin/sh\ncase " $* " in *" -n n2 "*) echo n2;; esac\n')
    _exe(fake / "sbatch", SBATCH_UNTIL_AFTER)
    env = {"PATH": f"{fake}:{os.environ['PATH']}"}
    proc = run_cli(["submit", *LOCAL, "-N", "2", "-t", "10", "--", "demo"], cwd=tmp_path,
                   env=env)
    assert proc.returncode == 1 and "no cluster in unit tests" in proc.stderr, proc.stderr
    assert "Slurm cannot place this job before the site's maintenance ends (maint_n2 on " \
           "nodes n2, from " in proc.stderr, proc.stderr
    assert "`sbatch --test-only` refuses it now and accepts it to begin at " in proc.stderr
    # refused after the maintenance too: the refusal is the job's
    _exe(fake / "sbatch", SBATCH_UNTIL_AFTER.replace("exit 0;;", "exit 1;;"))
    proc = run_cli(["submit", *LOCAL, "-N", "2", "-t", "10", "--", "demo"], cwd=tmp_path,
                   env=env)
    assert proc.returncode == 2 and "Slurm refuses this job" in proc.stderr, proc.stderr
