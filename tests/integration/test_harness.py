"""The slurm tier's own harness: no process of a local cluster outlives the test session
that started it, however the session ends. A session holding a job whose step runs is
ended as it ends in the field: its tests finish, Ctrl-C, a timeout's TERM, SIGKILL. Then
no process of the cluster may remain: daemons, guard, slurmstepd, the job's programs
(seen in /proc: what names the cluster's folder, works in it, has its SLURM_CONF, or runs
in its mount namespace). The cluster is the selected one (TRAIN_TEST_SLURM)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration import localslurm
from tests.integration.conftest import _skip_reason

pytestmark = [pytest.mark.slurm]

# A test session that starts the cluster through the slurm tier's own fixture, runs a job
# with a step, says where the cluster is, and then waits to be told to finish (or killed).
INNER = '''
import os, subprocess, time
from pathlib import Path

from tests.integration.conftest import slurm_env  # noqa: F401  (the fixture under test)


def test_a_session_with_a_running_step(slurm_env):
    env = {**os.environ, **slurm_env}
    subprocess.run(["sbatch", "-o", "/dev/null", "--wrap", "srun sleep 100000"], env=env,
                   check=True, cwd="/tmp", capture_output=True)
    while ".0 " not in subprocess.run(["squeue", "-h", "-s", "-o", "%i "], env=env,
                                      capture_output=True, text=True).stdout:
        time.sleep(0.2)
    probe = Path(os.environ["HARNESS_PROBE"])
    probe.write_text(slurm_env["SLURM_CONF"])
    while not probe.with_suffix(".finish").exists():
        time.sleep(0.2)
'''


def _as_from_a_terminal() -> None:
    """The inner session gets Ctrl-C as a terminal gives it: a suite started as a
    non-interactive shell's background job (`nox ... &`) inherits SIGINT ignored, and a
    Python started with SIGINT ignored keeps ignoring it (no KeyboardInterrupt at all)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.mark.parametrize("ending", ["finished", "SIGINT", "SIGTERM", "SIGKILL"])
def test_no_process_of_the_cluster_outlives_its_test_session(tmp_path: Path,
                                                             ending: str) -> None:
    reason = _skip_reason(localslurm.selected())
    if reason:
        pytest.skip(reason)
    (tmp_path / "test_inner.py").write_text(INNER)
    probe = tmp_path / "probe"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HARNESS_PROBE": str(probe)}
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_as_from_a_terminal)
    namespace = None
    try:
        while not probe.exists() and session.poll() is None:
            time.sleep(0.2)
        assert probe.exists(), session.communicate()[0].decode(errors="replace")
        folder = Path(probe.read_text()).parent
        namespace = localslurm.mount_namespace(folder)
        mntns = namespace[0] if namespace else None
        running = [cmd for _, cmd in localslurm.processes_of(folder, mntns)]
        assert any(cmd.startswith("slurmctld") for cmd in running), running
        assert any("sleep 100000" in cmd for cmd in running), running
        if ending == "finished":
            probe.with_suffix(".finish").touch()
        elif ending == "SIGINT":  # Ctrl-C: to the whole foreground process group
            os.killpg(session.pid, signal.SIGINT)
        else:
            os.kill(session.pid, getattr(signal, ending))
        out = session.communicate(timeout=300)[0].decode(errors="replace")
        if ending == "finished":
            assert session.returncode == 0, out
        # the guard stops a cluster its session left behind: wait for it (it names the
        # folder)
        deadline = time.monotonic() + 300  # (a bound on a hang, not a measure)
        while (left := localslurm.processes_of(folder, mntns)) and \
                time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
            session.wait()
        if namespace:
            os.close(namespace[1])
    assert left == [], f"after a session that ended by {ending}: {left}\n{out[-3000:]}"
    assert f"train-local-slurm {folder}" not in Path("/etc/hosts").read_text()


def test_stopping_a_cluster_spares_a_shell_that_exported_its_slurm_conf(
        slurm_env: dict[str, str]) -> None:
    """A user (or a test) that exported SLURM_CONF to talk to the cluster is no part of it:
    slurm-down.sh of another cluster folder with the same file name must not touch it, and
    by environment it takes only processes Slurm started for a job (SLURM_JOB_ID)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="th", dir="/tmp"))
    up = subprocess.run(["bash", str(REPO / "ci" / "slurm-up.sh"), str(folder)],
                        capture_output=True, text=True, timeout=300, check=False)
    bystander = None
    try:
        assert up.returncode == 0, up.stderr
        conf = up.stdout.strip().splitlines()[-1]
        bystander = subprocess.Popen(["sleep", "300"], env={**os.environ, "SLURM_CONF": conf},
                                     cwd="/tmp")
    finally:
        subprocess.run(["bash", str(REPO / "ci" / "slurm-down.sh"), str(folder)],
                       check=False, timeout=300)
        shutil.rmtree(folder, ignore_errors=True)
    assert bystander is not None
    try:
        assert bystander.poll() is None, "slurm-down.sh killed a process that only " \
            "had the cluster's SLURM_CONF in its environment"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_stale_namespace_number_stops_nobody(tmp_path: Path) -> None:
    """A cluster in a root of its own is swept by its mount namespace's number, and the kernel
    gives that number to the next `unshare` once the namespace is gone: slurm-down.sh of a
    cluster whose namespace ended must spare the namespace that has its number now (CI: a
    guard that ran late stopped the next cluster of the 24.11 tier so)."""
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a mount namespace of its own)")
    ended = subprocess.Popen(["true"])
    ended.wait()
    other = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--",
                              "sleep", "300"], cwd="/")
    try:
        ours = os.stat("/proc/self/ns/mnt").st_ino
        deadline = time.monotonic() + 60  # (a bound on a hang, not a measure)
        while (number := os.stat(f"/proc/{other.pid}/ns/mnt").st_ino) == ours:
            assert time.monotonic() < deadline and other.poll() is None
            time.sleep(0.05)
        (tmp_path / "mntns.id").write_text(f"{number}\n")
        (tmp_path / "mntns.pid").write_text(f"{ended.pid}\n")
        subprocess.run(["bash", str(REPO / "ci" / "slurm-down.sh"), str(tmp_path)],
                       check=True, timeout=300, cwd="/")
        assert other.poll() is None, "slurm-down.sh killed a process of another namespace " \
            "that had the stopped cluster's namespace number"
    finally:
        other.kill()
        other.wait()


def _ports(conf: Path) -> set[int]:
    text = conf.read_text()
    ctld = int(text.split("SlurmctldPort=")[1].split()[0])
    first, last = text.split(" Port=[")[1].split("]")[0].split("-")
    return {ctld, *range(int(first), int(last) + 1)}


def test_a_cluster_started_beside_another_has_ports_of_its_own_below_the_outgoing_range(
        slurm_env: dict[str, str]) -> None:
    """CI runs six clusters side by side, of three Slurm versions: a controller whose port
    another cluster's daemon (or any process's outgoing connection) holds never comes up,
    and the client then talks to the other one ("Insane message length" from a controller of
    another version). Each cluster's three ports are its own, below Linux's range for
    outgoing connections and above the chain engine's rendezvous ports."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    with localslurm.local_cluster(localslurm.selected(), "tb", session_path=False) as env:
        beside = _ports(Path(env["SLURM_CONF"]))
        ours = _ports(Path(slurm_env["SLURM_CONF"]))
        assert len(beside) == 3 and not beside & ours, (beside, ours)
        assert all(30000 <= port < min(low, 32768) for port in beside | ours), (beside, ours)


def test_a_cluster_chooses_its_ports_under_the_lock_of_the_clusters_beside_it(
        slurm_env: dict[str, str]) -> None:
    """Two clusters starting at once must not both find the same ports free: the choice and
    its record (the /etc/hosts line, the slurm.conf that names the port) happen under the
    lock every start and stop takes. Held here, a start waits for it and writes nothing."""
    import fcntl
    import shutil
    import tempfile
    import threading

    folder = Path(tempfile.mkdtemp(prefix="tl", dir="/tmp"))
    cluster = localslurm.LocalCluster(folder, localslurm.selected())
    got: list[object] = []

    def start() -> None:
        try:
            got.append(cluster.start())
        except Exception as exc:  # (the test reports it)
            got.append(exc)

    starting = threading.Thread(target=start)
    try:
        with open("/tmp/.train-local-slurm-hosts.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            starting.start()
            while not _blocked_on_the_lock(folder) and starting.is_alive():
                time.sleep(0.1)
            assert starting.is_alive(), got
            assert not (folder / "slurm.conf").exists()
            assert f"train-local-slurm {folder}" not in Path("/etc/hosts").read_text()
        starting.join()
        assert got and isinstance(got[0], dict), got
        assert len(_ports(folder / "slurm.conf")) == 3
    finally:
        if starting.ident is not None:  # (never started where the lock could not be taken)
            starting.join()
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _blocked_on_the_lock(folder: Path) -> bool:
    """A `flock` whose parent is the start of the cluster in `folder` (its command line
    names the folder)."""
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == "flock":
                parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
                if str(folder) in Path(f"/proc/{parent}/cmdline").read_text():
                    return True
    return False
