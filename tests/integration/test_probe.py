"""Profiles against the site as it is (issue 26), on the REAL local SLURM cluster (see
conftest.py; ci/slurm-up.sh: nodes n1, n2 with 4 CPUs, 8000 MB and gpu:2 each, partition
debug, the default, MaxTime=60, EnforcePartLimits=ALL, no accounting database).

- `train clusters probe local` reports each of those values as Slurm gives them, and a
  user profile that says otherwise (8 GPUs a node, a 2-hour limit, a GPU type the nodes
  lack) is shown line by line and corrected by --write; the written profile then renders
  a job Slurm accepts, and it runs.
- A job Slurm would refuse (a partition it lacks, a GRES type its nodes lack, a time over
  the partition's limit) is refused at submit with Slurm's words, and nothing is queued.
- A pending chunk's status says why it waits, in words, and Slurm's expected start.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli
from tests.integration.chains import job_flags, settled, slurm, status, submit, wait

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# what a newcomer might believe of this cluster: every value here is wrong for it
WRONG = """\
name: local
extends: local
gpu_type_request: gres
partitions:
  debug:
    gpus_per_node: 8
    gpu_types: [a100]
    cpus_per_node: 4
    mem_per_node: 8000M
    max_time: "2:00:00"
    max_nodes: 2
    cpu_jobs: true
  big:
    gpus_per_node: 2
    cpus_per_node: 4
    mem_per_node: 8000M
    max_time: "1:00:00"
    cpu_jobs: true
"""


def _home(tmp_path: Path, slurm_env: dict[str, str], profile: str | None) -> dict[str, str]:
    """An environment whose ~/.config/train/clusters holds `profile` as local.yaml."""
    home = tmp_path / "home"
    folder = home / ".config" / "train" / "clusters"
    folder.mkdir(parents=True)
    if profile is not None:
        (folder / "local.yaml").write_text(profile)
    return {**slurm_env, "HOME": str(home)}


def _queued(env: dict[str, str]) -> set[str]:
    """The id and name of every job the cluster knows, in any state (the test-only asks
    leave none). Compared as `after <= before`: an ended job of another test leaves the
    list MinJobAge after its end, which may fall between the two looks."""
    return set(slurm(["squeue", "-h", "-t", "all", "-o", "%i %j"], env).splitlines())


def test_probe_reports_each_value_of_the_local_cluster_exactly(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    env = _home(tmp_path, slurm_env, None)
    proc = run_cli(["clusters", "probe", "local"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert ("partition debug (the default): 2 nodes, 4 CPUs, 8000M, 2 GPUs [] each; "
            "max_time 01:00:00, at most 2 nodes a job  (sinfo)") in out, out
    assert "differences: none; the profile says what the site says" in out, out
    assert "EnforcePartLimits = ALL  (scontrol show config)" in out, out
    assert "KillWait = 5 sec  (scontrol show config)" in out, out
    version = slurm(["scontrol", "--version"], env).split()[-1]
    assert f"SLURM_VERSION = {version}  (scontrol show config)" in out, out
    # no accounting database here: said, and the profile's QOS limits stay
    unread = out.split("could not read (the profile's values stay as they are):")[1]
    assert "QOS limits: `sacctmgr -n -P show qos format=Name,MaxWall` failed (exit status " \
           "1): " in unread, out
    assert "max_array_size" not in out, out  # the default MaxArraySize, as the profile says


def test_a_wrong_user_profile_is_shown_corrected_by_write_and_then_accepted(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    env = _home(tmp_path, slurm_env, WRONG)
    proc = run_cli(["clusters", "probe", "local"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    for line in ("partitions.debug.gpus_per_node: profile says 8, the site says 2",
                 "partitions.debug.gpu_types: profile says [a100], the site says []",
                 "partitions.debug.max_time: profile says 02:00:00, the site says 01:00:00",
                 "partitions.big: profile lists it, the site's sinfo shows no such "
                 "partition"):
        assert line in proc.stdout, proc.stdout
    written = Path(env["HOME"]) / ".config" / "train" / "clusters" / "local.yaml"
    assert not (written.parent / "local.yaml.1").exists()  # probe alone writes nothing

    proc = run_cli(["clusters", "probe", "local", "--write"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "the profile local now says what the site says" in proc.stdout, proc.stdout
    assert (written.parent / "local.yaml.1").read_text() == WRONG
    assert f"(the earlier file is kept as {written}.1)" in proc.stdout, proc.stdout
    text = written.read_text()
    debug = yaml.safe_load(text)["partitions"]["debug"]
    assert (debug["gpus_per_node"], debug["gpu_types"], debug["max_time"]) == (
        2, [], "01:00:00"), text
    assert "big" not in yaml.safe_load(text)["partitions"], text
    assert yaml.safe_load(text)["max_array_size"] == 1001, text  # scontrol's MaxArraySize
    assert "left out: partitions big (sinfo shows no such partition)" in proc.stdout
    gpus = next(line for line in text.splitlines() if "gpus_per_node" in line)
    assert "# 20" in gpus and "sinfo -h -N -o" in gpus, gpus  # the date and the command

    again = run_cli(["clusters", "probe", "local"], cwd=tmp_path, env=env)
    assert "differences: none" in again.stdout, again.stdout
    # a second --write of the same values leaves the file as it was, with no copy; the
    # user's own stays in .1
    again = run_cli(["clusters", "probe", "local", "--write"], cwd=tmp_path, env=env)
    assert "holds these values already" in again.stdout, again.stdout
    assert (written.parent / "local.yaml.1").read_text() == WRONG
    assert not (written.parent / "local.yaml.2").exists() and written.read_text() == text
    # the corrected profile's own limits: all of a node's GPUs, the partition's whole hour
    submit(tmp_path, env, "probed", ["--entry", "command", "--gpus-per-node", "2",
                                     "--time", "60:00", "--max-chunks", "1"], ["true"])
    job_id = status(tmp_path, env, "probed")["chunks"][0]["job_id"]
    fields = slurm(["scontrol", "show", "job", job_id], env)
    assert "TimeLimit=01:00:00" in fields and "gpu:2" in fields, fields
    # Slurm scheduled it on a node (its fake GPUs then fail the GPU step: not this test's)
    st = wait(tmp_path, env, "probed", settled)
    assert st["chunks"][0]["state"] in ("COMPLETED", "FAILED"), st
    assert "NodeList=n" in slurm(["scontrol", "show", "job", job_id], env)


@pytest.mark.parametrize(("flags", "field", "words"), [
    (["--partition", "big"], "partition", "Invalid partition name specified"),
    (["--gpus-per-node", "1", "--gpu-type", "a100"], "gpus",
     "Requested node configuration is not available"),
    (["--gpus-per-node", "4"], "gpus", "Requested node configuration is not available"),
    (["--time", "90"], "time", "Requested time limit is invalid"),
])
def test_a_job_slurm_would_refuse_is_refused_before_anything_is_queued(
        tmp_path: Path, slurm_env: dict[str, str], flags: list[str], field: str,
        words: str) -> None:
    env = _home(tmp_path, slurm_env, WRONG)  # the profile allows each of these
    before = _queued(env)
    proc = run_cli(["submit", "--name", "refused", *job_flags("--entry", "command", *flags),
                    "--", "true"], cwd=tmp_path, env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith(f"train: error: {field}: Slurm refuses this job "
                                  "(`sbatch --test-only`:"), proc.stderr
    assert words in proc.stderr and "nothing was queued" in proc.stderr, proc.stderr
    assert "train clusters probe local" in proc.stderr, proc.stderr
    assert _queued(env) <= before, _queued(env) - before
    assert not (tmp_path / "runs" / "refused").exists()


def test_cpus_the_nodes_do_not_have_are_named_not_the_gpus(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """A profile that says 8 CPUs a node (ci/slurm-up.sh's nodes have 4) lets -c 8
    through to Slurm, whose refusal ("Requested node configuration is not available") was
    blamed on the GPUs: --gpus-per-node 0."""
    more_cpus = "name: local\nextends: local\npartitions:\n  debug:\n    gpus_per_node: 2\n" \
        "    gpu_types: []\n    cpus_per_node: 8\n    mem_per_node: 8000M\n" \
        "    max_time: \"1:00:00\"\n    max_nodes: 2\n    cpu_jobs: true\n"
    env = _home(tmp_path, slurm_env, more_cpus)
    before = _queued(env)
    proc = run_cli(["submit", "--name", "cpus", *job_flags("--entry", "command",
                                                           "--cpus-per-task", "8"),
                    "--", "true"], cwd=tmp_path, env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("train: error: cpus_per_task: Slurm refuses this job "
                                  "(`sbatch --test-only`:"), proc.stderr
    assert "--cpus-per-task 8, and the partition debug's nodes have at most 4 CPUs each " \
           "(sinfo; the profile says 8)" in proc.stderr, proc.stderr
    assert "gpus-per-node" not in proc.stderr, proc.stderr
    assert _queued(env) <= before and not (tmp_path / "runs" / "cpus").exists()


def test_no_check_submits_without_asking_slurm(tmp_path: Path,
                                               slurm_env: dict[str, str]) -> None:
    """The escape hatch: sbatch itself then refuses (exit 1), and nothing stays queued."""
    env = _home(tmp_path, slurm_env, WRONG)
    proc = run_cli(["submit", "--name", "unasked", "--no-check",
                    *job_flags("--entry", "command", "--partition", "big"), "--", "true"],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "--test-only" not in proc.stderr and "partition" in proc.stderr, proc.stderr
    assert not [job for job in _queued(env) if job.endswith(" unasked")]


def test_a_pending_chunk_says_why_it_waits_and_when_it_is_expected_to_start(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # every CPU of both nodes taken for 10 minutes: the chain's chunk waits for Resources
    blocker = slurm(["sbatch", "--parsable", "-N", "2", "--exclusive", "-t", "10",
                     "-J", "blocker", "-o", "/dev/null", "--wrap", "sleep 600"],
                    slurm_env).strip().split(";")[0]
    try:
        wait_flags = ["--entry", "command", "--time", "5", "--max-chunks", "1"]
        submit(tmp_path, slurm_env, "waits", wait_flags, ["true"])

        def estimated(st: dict[str, object]) -> bool:
            chunk = st["chunks"][0]  # type: ignore[index]
            # the backfill pass may set the start estimate before the main scheduler has
            # given a reason ("None" until then, more often on a busy machine): wait for both
            return bool(chunk["state"] == "PENDING" and chunk["expected_start"]
                        and chunk["reason"] not in (None, "", "None"))

        st = wait(tmp_path, slurm_env, "waits", estimated)
        assert st["chunks"][0]["reason"] in ("Resources", "Priority"), st
        proc = run_cli(["status", "waits"], cwd=tmp_path, env=slurm_env)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        waiting = next(line for line in lines if line.strip().startswith("waiting:"))
        assert waiting.strip() in ("waiting: it is next, waiting for enough nodes, GPUs or "
                                   "memory to become free",
                                   "waiting: other jobs come first (higher priority); it "
                                   "starts when its turn comes"), proc.stdout
        start = next(line for line in lines if line.strip().startswith("expected start:"))
        assert " UTC (" in start and "no estimate" not in start, proc.stdout
        assert status(tmp_path, slurm_env, "waits")["chunks"][0]["expected_start"] > 0
    finally:
        slurm(["scancel", blocker], slurm_env)
        run_cli(["cancel", "waits"], cwd=tmp_path, env=slurm_env)


def test_a_maintenance_ahead_is_said_by_probe_submit_and_status(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # n1 reserved for maintenance from 5 minutes on (the tests run as root, the cluster's
    # SlurmUser: Slurm's admin); a 10-minute chunk of both nodes crosses it. Slurm's test
    # refuses such a job ("Requested node configuration is not available"), sbatch queues
    # it to wait: submit refused it, blaming its GPUs
    slurm(["scontrol", "create", "reservation", "ReservationName=maint_t",
           "StartTime=now+5minutes", "Duration=30", "Nodes=n1", "Users=root",
           "Flags=MAINT"], slurm_env)
    try:
        probe = run_cli(["clusters", "probe", "local"], cwd=tmp_path, env=slurm_env)
        assert "maintenance: maint_t on nodes n1, from " in probe.stdout, probe.stdout
        # a chain whose floor (8 minutes) is longer than the time left before it: it waits
        proc = run_cli(["submit", "--name", "maint", *job_flags(
            "--entry", "command", "--time", "10", "--max-chunks", "2", "--stop-signal",
            "USR1", "--time-min", "8", "-N", "2"), "--", "true"], cwd=tmp_path,
            env=slurm_env)
        assert proc.returncode == 0, proc.stderr
        assert "train: note: the site's maintenance maint_t on nodes n1" in proc.stderr
        assert "a chunk may start shorter than --time (down to its floor, --time-min " \
               "00:08:00) so as to end before it" in proc.stderr, proc.stderr
        assert "Slurm cannot place this job before the site's maintenance ends" in proc.stderr

        def behind(st: dict[str, object]) -> bool:
            return "reserved" in str(st["chunks"][0]["reason"])  # type: ignore[index]

        st = wait(tmp_path, slurm_env, "maint", behind)
        assert st["chunks"][0]["reason"] == "ReqNodeNotAvail, May be reserved for other job"
        out = run_cli(["status", "maint"], cwd=tmp_path, env=slurm_env).stdout
        end = slurm(["scontrol", "show", "reservation", "maint_t"], slurm_env)
        until = end.split("EndTime=")[1][:16].replace("T", " ")  # (the cluster's TZ: UTC)
        assert f"waiting: the site's maintenance maint_t (until {until} UTC) holds the " \
               "nodes it needs" in out, out
    finally:
        run_cli(["cancel", "maint"], cwd=tmp_path, env=slurm_env)
        slurm(["scontrol", "delete", "ReservationName=maint_t"], slurm_env)
