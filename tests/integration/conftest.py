"""A real SLURM cluster for the `slurm` tier: started once per session by ci/slurm-up.sh
(munged, slurmctld, two slurmd on loopback, fake GPUs; Slurm 24.11 in a trixie root with
TRAIN_TEST_SLURM=24.11), stopped by PID afterwards, also when the session is killed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration import localslurm

NEEDED = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")
TRIXIE_NEEDED = ("debootstrap", "unshare", "nsenter", "chroot")


def _skip_reason(version: str) -> str | None:
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (its daemons run as SlurmUser=root)"
    needed = TRIXIE_NEEDED if version in localslurm.ROOT_SCRIPTS else NEEDED
    missing = [cmd for cmd in needed if shutil.which(cmd) is None]
    if missing:
        return (f"{', '.join(missing)} not installed: run `bash ci/bootstrap.sh` as root "
                "(apt-get install slurm-wlm munge debootstrap)")
    return None


@pytest.fixture(scope="session")
def slurm_env() -> Iterator[dict[str, str]]:
    """The local cluster's environment (SLURM_CONF; with TRAIN_TEST_SLURM=24.11 also PATH,
    trixie's client commands first). Stopped by PID when the session ends, however it ends
    (tests/integration/localslurm.py)."""
    try:
        version = localslurm.selected()
    except ValueError as exc:
        pytest.fail(str(exc))
    reason = _skip_reason(version)
    if reason:
        pytest.skip(reason)
    try:
        with localslurm.local_cluster(version) as env:
            yield env
    except localslurm.ClusterError as exc:
        pytest.fail(str(exc))


CI_BASE_TAG = "train-ci-base:bookworm"
CI_IMAGE_TAG = "train/base:ci"
# CI's offline wheels (the CPU torch stack, cp311) live where a cluster build never looks:
# base.def installs offline from its WHEELHOUSE whenever that folder holds wheels
CI_WHEELHOUSE = ".nox/wheelhouse"
CI_BUILD_ARGS = ("--build-arg", f"BASE_IMAGE={CI_BASE_TAG}", "--build-arg",
                 "BASE_LOCK=base-cpu.txt", "--build-arg", f"WHEELHOUSE={CI_WHEELHOUSE}")
CI_SC2_TAG = "train/sc2:ci"


def sc2_build_args() -> list[str]:
    """CI's build arguments for sc2.def (ci/sc2_standins.py: stand-ins for the game and the
    maps, and the lock's wheels, in containers/downloads)."""
    proc = subprocess.run([sys.executable, str(REPO / "ci" / "sc2_standins.py"), CI_IMAGE_TAG],
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        pytest.fail(f"ci/sc2_standins.py failed: {proc.stderr[-2000:]}")
    return proc.stdout.splitlines()


# One Docker engine for every pytest of a `nox -s tests` (the noxfile starts it and names
# its socket here): the main run and the runs beside it then debootstrap the base and
# build CI's images once, not once each; a lock beside the socket takes them in turn.
SHARED_ENGINE = "TRAIN_TEST_DOCKER_HOST"


@contextlib.contextmanager
def _engine_turn(env: dict[str, str]) -> Iterator[None]:
    """Holds the engine's build lock: one pytest at a time makes what all of them use."""
    import fcntl

    socket = env["DOCKER_HOST"].removeprefix("unix://")
    with open(Path(socket).parent / "build.lock", "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _prepare_engine(env: dict[str, str]) -> None:
    """The debootstrapped stand-in for the CUDA base image and the offline wheelhouse."""
    with _engine_turn(env):
        base = subprocess.run(["bash", str(REPO / "ci" / "base-rootfs.sh"), CI_BASE_TAG],
                              capture_output=True, text=True, timeout=900, check=False)
        if base.returncode != 0:
            pytest.fail(f"base-rootfs.sh failed: {base.stderr[-2000:]}")
        wheels = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes",
             "-d", str(REPO / CI_WHEELHOUSE), "-r",
             str(REPO / "containers" / "requirements" / "base-cpu.txt")],
            capture_output=True, text=True, timeout=900, check=False)
        if wheels.returncode != 0:
            pytest.fail(f"wheelhouse download failed: {wheels.stderr[-2000:]}")


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[dict[str, str]]:
    """A real dockerd (ci/docker-up.sh; the shared one where SHARED_ENGINE names it), the
    debootstrapped stand-in for the CUDA base image, and the offline wheelhouse the image
    build installs from."""
    if os.geteuid() != 0:
        pytest.skip("the Docker engine for image tests needs root")
    missing = [c for c in ("dockerd", "docker", "debootstrap") if shutil.which(c) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: run `bash ci/bootstrap.sh` as root "
                    "(apt-get install docker.io debootstrap)")
    previous = os.environ.get("DOCKER_HOST")
    shared = os.environ.get(SHARED_ENGINE)
    folder = None if shared else Path(tempfile.mkdtemp(prefix="dk", dir="/tmp"))
    try:
        if folder is not None:
            up = subprocess.run(["bash", str(REPO / "ci" / "docker-up.sh"), str(folder)],
                                capture_output=True, text=True, timeout=120, check=False)
            if up.returncode != 0:
                pytest.fail(f"docker-up.sh failed: {up.stderr}")
            shared = up.stdout.strip().splitlines()[-1]
        assert shared
        env = {"DOCKER_HOST": shared}
        os.environ["DOCKER_HOST"] = shared
        _prepare_engine(env)
        yield env
    finally:
        if folder is not None:
            subprocess.run(["bash", str(REPO / "ci" / "docker-down.sh"), str(folder)],
                           check=False, timeout=120)
            shutil.rmtree(folder, ignore_errors=True)
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous


def _built_once(tag: str, argv: list[str], docker_engine: dict[str, str]) -> str:
    """`train image build ARGV --tag TAG`, unless the engine holds TAG already (another
    pytest on the shared engine may be building it: its turn is waited for)."""
    import docker

    with _engine_turn(docker_engine):
        try:
            docker.from_env().images.get(tag)
        except docker.errors.ImageNotFound:
            proc = subprocess.run([sys.executable, "-m", "train", "image", "build", *argv,
                                   "--engine", "docker", "--tag", tag],
                                  capture_output=True, text=True, timeout=1800, check=False,
                                  env={**os.environ, **docker_engine})
            if proc.returncode != 0:
                pytest.fail(f"building {tag} failed: {proc.stderr[-3000:]}")
    return tag


@pytest.fixture(scope="session")
def ci_image(docker_engine: dict[str, str]) -> str:
    """The base image built from base.def for CI (built once per session)."""
    return _built_once(CI_IMAGE_TAG, ["base", *CI_BUILD_ARGS], docker_engine)


@pytest.fixture(scope="session")
def sc2_image(ci_image: str, docker_engine: dict[str, str]) -> str:
    """sc2.def built on the CI base image (once per session), offline: the stand-ins and
    the lock's wheels in containers/downloads."""
    return _built_once(CI_SC2_TAG, ["sc2", *sc2_build_args()], docker_engine)


class SiteUser:
    """The ordinary user of the apptainer tier (ci/sid-apptainer.sh): commands run as that
    user in the sid root, where Apptainer 1.4 and Slurm 26.05 are, as a site's users run
    them. Its folders are made by `folder` (owned by the user, readable by the tests)."""

    def __init__(self, as_user: Path, uid: int, env: dict[str, str]) -> None:
        self.as_user = as_user
        self.uid = uid
        self.env = env

    def run(self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        full = {**os.environ, "OMP_NUM_THREADS": "1", **self.env, **(env or {})}
        full.pop("TRAIN_DEFAULTS", None)  # the tests' own file: the user has a home of theirs
        return subprocess.run([str(self.as_user), *argv], capture_output=True, text=True,
                              cwd=cwd, env=full, timeout=timeout, check=False)

    def cli(self, args: list[str], *, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`train ARGS` as the user (this session's Python and its venv, bound in)."""
        return self.run([sys.executable, "-m", "train", *args], cwd=cwd, env=env,
                        timeout=timeout)

    def status(self, cwd: Path, name: str) -> dict[str, Any]:
        """`train status NAME --json` as the user."""
        proc = self.cli(["status", name, "--json"], cwd=cwd)
        assert proc.returncode == 0, proc.stderr
        data: dict[str, Any] = json.loads(proc.stdout)
        return data

    def wait(self, cwd: Path, name: str, until: Callable[[dict[str, Any]], bool],
             polls: int = 600) -> dict[str, Any]:
        """The chain's status once `until` holds (polled every 0.5 s, at most `polls`
        times: a bound on a hang, not a measure)."""
        st: dict[str, Any] = {}
        for _ in range(polls):
            st = self.status(cwd, name)
            if until(st):
                return st
            time.sleep(0.5)
        raise AssertionError(f"{name} never reached the state: {json.dumps(st, indent=1)}")

    def folder(self, prefix: str = "user") -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
        os.chown(path, self.uid, self.uid)
        path.chmod(0o755)
        return path


@pytest.fixture(scope="session")
def site_user() -> Iterator[SiteUser]:
    """The apptainer tier's user, on a cluster of its own beside the session's: Slurm
    26.05 and Apptainer 1.4 in a sid root (ci/sid-apptainer.sh, made once per machine),
    stopped by PID when the session ends."""
    reason = _skip_reason(localslurm.SID)
    if reason:
        pytest.skip(reason)
    made: list[Path] = []
    try:
        with localslurm.local_cluster(localslurm.SID, prefix="sa",
                                      session_path=False) as env:
            bin_dir = Path(env["PATH"].split(os.pathsep)[0])
            user = SiteUser(bin_dir / "as-user", (bin_dir.parent / "home").stat().st_uid,
                            env)
            original = user.folder

            def folder(prefix: str = "user") -> Path:
                made.append(original(prefix))
                return made[-1]

            user.folder = folder  # type: ignore[method-assign]
            yield user
    except localslurm.ClusterError as exc:
        pytest.fail(str(exc))
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def plain_sif(site_user: SiteUser) -> Path:
    """A SIF of plain Debian bookworm with python3 (no torch, no train), made once per
    machine by ci/sid-apptainer.sh and copied where the user's jobs read it."""
    proc = subprocess.run(["bash", str(REPO / "ci" / "sid-apptainer.sh"), "plain-image"],
                          capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        pytest.fail(f"ci/sid-apptainer.sh plain-image failed: {proc.stderr[-3000:]}")
    sif = site_user.folder("images") / "plain-python3.sif"
    shutil.copyfile(proc.stdout.strip().splitlines()[-1], sif)
    os.chown(sif, site_user.uid, site_user.uid)
    return sif


# measured build and conversion times of this session's SIFs, printed at its end
SIF_TIMES: dict[str, float] = {}


@pytest.fixture(scope="session")
def ci_sif(ci_image: str, docker_engine: dict[str, str], site_user: SiteUser) -> Path:
    """CI's base image (the `ci_image` fixture, built by Docker from base.def) converted to
    a SIF by the real Apptainer, as the user (once per session, about 1 GB): `train image
    export` to a docker-archive in a user folder, then `apptainer build SIF
    docker-archive:TAR`. The SIF is the user's, in a user folder; tests may read it, never
    change it (copy it first)."""
    import time

    folder = site_user.folder("cisif")
    tar = folder / "base-ci.tar"
    export = subprocess.run([sys.executable, "-m", "train", "image", "export", "base",
                             "--engine", "docker", "--tag", ci_image, "--out", str(tar)],
                            capture_output=True, text=True, timeout=900, check=False,
                            env={**os.environ, **docker_engine})
    if export.returncode != 0:
        pytest.fail(f"train image export of {ci_image} failed: {export.stderr[-3000:]}")
    os.chown(tar, site_user.uid, site_user.uid)
    sif = folder / "base-ci.sif"
    start = time.monotonic()
    build = site_user.run(["apptainer", "build", str(sif), f"docker-archive:{tar}"],
                          cwd=folder, timeout=1800)
    SIF_TIMES["ci_sif (docker-archive -> SIF)"] = time.monotonic() - start
    tar.unlink()
    if build.returncode != 0:
        pytest.fail(f"apptainer build of {sif} from {ci_image} failed: "
                    f"{(build.stdout + build.stderr)[-3000:]}")
    return sif


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for what, seconds in SIF_TIMES.items():
        terminalreporter.write_line(f"SIF build time: {what}: {seconds:.0f} s")


@pytest.fixture(scope="session")
def apptainer_sif(ci_sif: Path, site_user: SiteUser) -> Path:
    """base.def built by the real Apptainer as the user (`train image build base --engine
    apptainer --fakeroot`), on the CI base's SIF (`--base-sif`: Bootstrap localimage), so
    that %files, %post, %environment, %labels, %runscript and %test run under Apptainer's
    rules; offline, from CI's wheelhouse. Once per session."""
    import time

    folder = site_user.folder("appsif")
    sif = folder / "base.sif"
    start = time.monotonic()
    build = site_user.cli(["image", "build", "base", "--engine", "apptainer", "--fakeroot",
                           "--base-sif", str(ci_sif), "--build-arg", "BASE_LOCK=base-cpu.txt",
                           "--build-arg", f"WHEELHOUSE={CI_WHEELHOUSE}", "--out", str(sif)],
                          cwd=folder, timeout=3600)
    SIF_TIMES["apptainer_sif (base.def on ci_sif, apptainer build --fakeroot)"] = \
        time.monotonic() - start
    if build.returncode != 0:
        pytest.fail(f"train image build base --engine apptainer failed: "
                    f"{(build.stdout + build.stderr)[-3000:]}")
    return sif
