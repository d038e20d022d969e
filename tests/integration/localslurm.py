"""The local SLURM clusters of the `slurm` tier, and what makes sure none outlives its tests.

Three clusters, the same slurm.conf (ci/slurm-up.sh): the machine's own Slurm (Debian
bookworm's 22.05); with TRAIN_TEST_SLURM=24.11 Debian trixie's Slurm 24.11 in a trixie
root under chroot (ci/trixie-slurm.sh); with TRAIN_TEST_SLURM=26.05 Debian sid's Slurm
26.05 in a sid root entered with pivot_root, beside a real Apptainer 1.4 and an ordinary
user who runs it (ci/sid-apptainer.sh). A root's client commands come first on the tests'
PATH.

A cluster is stopped by ci/slurm-down.sh, by PID: its daemons, the slurmstepd of its jobs
and its jobs' programs. A guard (ci/slurm-guard.sh), started before the cluster in a
session of its own, stops it when the test session ends without doing so itself (SIGKILL,
a crash, a timeout's TERM); SIGTERM and SIGHUP to the session are turned into an interrupt,
so that pytest tears its fixtures down as it does for Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from tests.conftest import REPO

CI = REPO / "ci"
VERSION_VAR = "TRAIN_TEST_SLURM"
TRIXIE = "24.11"  # Debian trixie's slurm-wlm
SID = "26.05"  # Debian sid's slurm-wlm, with apptainer
CHOICES = ("", "host", TRIXIE, SID)
ROOT_SCRIPTS = {TRIXIE: "trixie-slurm.sh", SID: "sid-apptainer.sh"}


class ClusterError(RuntimeError):
    pass


def selected() -> str:
    """'' for the machine's own Slurm, TRIXIE or SID for a root's; a ValueError naming
    the variable for anything else."""
    value = os.environ.get(VERSION_VAR, "").strip()
    if value not in CHOICES:
        raise ValueError(f"{VERSION_VAR}={value!r}: allowed are {TRIXIE} (Debian trixie's "
                         f"Slurm in a chroot), {SID} (Debian sid's Slurm and Apptainer in a "
                         "root of their own) or host (the machine's own slurm-wlm, also when "
                         "unset)")
    return value if value in ROOT_SCRIPTS else ""


def python_binds() -> list[str]:
    """What a job in a root of its own needs to run this Python at the same paths: the
    repository (with its .nox venvs), the venv, and the Python installation it is made from
    (only its standard library and executable where that is the system's /usr)."""
    base = Path(sys.base_prefix).resolve()
    paths = [REPO, Path(sys.prefix)]
    if base in (Path("/usr"), Path("/")):
        paths += [Path(sysconfig.get_paths()["stdlib"]),
                  Path(sysconfig.get_paths()["platstdlib"]),
                  Path(sys.executable).resolve()]
    else:  # pyenv, /usr/local, /opt/...: the whole installation
        paths.append(base)
    return [str(p) for p in paths]


def mount_namespace(folder: Path) -> tuple[int, int] | None:
    """The mount namespace a cluster in a root of its own runs in (None for the host's), as
    its number and a descriptor of it that the caller closes: the kernel gives a namespace's
    number to the next `unshare` once it is gone, and an open descriptor keeps it."""
    try:
        number = int((folder / "mntns.id").read_text())
        fd = os.open(f"/proc/{int((folder / 'mntns.pid').read_text())}/ns/mnt", os.O_RDONLY)
    except (OSError, ValueError):
        return None
    if os.fstat(fd).st_ino == number:
        return number, fd
    os.close(fd)
    return None


def processes_of(folder: Path, mntns: int | None = None) -> list[tuple[int, str]]:
    """Every process (but this one) of the cluster in `folder`: its command line names the
    folder (the daemons, the guard), its environment says SLURM_CONF=folder/slurm.conf (the
    jobs), it works in the folder (slurmd's slurmstepd), or it runs in the cluster's mount
    namespace `mntns`. As (PID, command line)."""
    name = str(folder)
    conf = b"SLURM_CONF=" + name.encode() + b"/slurm.conf"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
            namespace = os.stat(entry / "ns" / "mnt").st_ino
        except OSError:
            continue  # gone, or a zombie (nothing left of it but its exit status)
        if name.encode() in cmdline or conf in environ.split(b"\0") or cwd == name or \
                cwd.startswith(name + "/") or (mntns is not None and namespace == mntns):
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(
                errors="replace").strip()))
    return found


class LocalCluster:
    """One cluster in `folder` (short: the munge socket path must stay under 108 bytes)."""

    def __init__(self, folder: Path, version: str = "") -> None:
        self.folder = folder
        self.version = version
        self._guard: subprocess.Popen[bytes] | None = None
        self._guard_pipe: int | None = None

    def _up(self) -> list[str]:
        if self.version in ROOT_SCRIPTS:
            return ["bash", str(CI / ROOT_SCRIPTS[self.version]), "up", str(self.folder),
                    *python_binds()]
        return ["bash", str(CI / "slurm-up.sh"), str(self.folder)]

    def start(self) -> dict[str, str]:
        """Start it (the guard first); the environment its commands need."""
        if self.version in ROOT_SCRIPTS:  # made once per machine (minutes), then cached
            script = ROOT_SCRIPTS[self.version]
            root = subprocess.run(["bash", str(CI / script), "root"],
                                  capture_output=True, text=True, timeout=1800, check=False)
            if root.returncode != 0:
                raise ClusterError(f"ci/{script} root failed: {root.stderr[-3000:]}")
        read, self._guard_pipe = os.pipe()
        try:
            self._guard = subprocess.Popen(
                ["bash", str(CI / "slurm-guard.sh"), str(self.folder)], stdin=read,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(read)
        try:
            proc = subprocess.run(self._up(), capture_output=True, text=True, timeout=300,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            self.stop()
            raise ClusterError(f"{' '.join(self._up()[:3])} timed out: {exc.stderr!r}") \
                from exc
        if proc.returncode != 0:
            self.stop()
            raise ClusterError(f"{' '.join(self._up()[:3])} failed: {proc.stderr}")
        env = {"SLURM_CONF": proc.stdout.strip().splitlines()[-1]}
        if self.version in ROOT_SCRIPTS:
            env["PATH"] = f"{self.folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        return env

    def stop(self) -> None:
        """Stop everything of it (ci/slurm-down.sh), then release the guard; where the stop
        did not finish, the guard does it again."""
        finished = False
        try:
            proc = subprocess.run(["bash", str(CI / "slurm-down.sh"), str(self.folder)],
                                  check=False, timeout=300)
            finished = proc.returncode == 0
        except subprocess.TimeoutExpired:
            pass
        finally:
            if self._guard_pipe is not None:
                with contextlib.suppress(OSError):
                    if finished:
                        os.write(self._guard_pipe, b"done\n")
                os.close(self._guard_pipe)
                self._guard_pipe = None
            if self._guard is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._guard.wait(timeout=300)
                self._guard = None


class _Interrupted(KeyboardInterrupt):
    pass


@contextlib.contextmanager
def interrupt_on_terminate() -> Iterator[None]:
    """While the cluster is up, SIGTERM and SIGHUP interrupt the session as Ctrl-C does
    (pytest then runs every finalizer); where a handler is set already, it is kept."""
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted(f"the test session received {signal.Signals(signum).name}")

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def local_cluster(version: str = "", prefix: str = "ts", *, session_path: bool = True
                  ) -> Iterator[dict[str, str]]:
    """A cluster for the `with` block: its environment, and nothing of it left after. With
    `session_path`, a root's client commands also come first on this session's PATH (for
    tests that build PATH from the session's own); without, only in the returned env (a
    second cluster beside the session's)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # munge socket path < 108
    cluster = LocalCluster(folder, version)
    path = os.environ.get("PATH")
    try:
        with interrupt_on_terminate():
            env = cluster.start()
            if "PATH" in env and session_path:
                os.environ["PATH"] = env["PATH"]
            yield env
    finally:
        if path is not None:
            os.environ["PATH"] = path
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
