"""Bring your own image (issue 21, item 2): what submit finds out about an image without
our labels (its Python, torch, `train`, NVML), the cache of that answer, the refusals
(exit 2, nothing queued), and the client's launcher bound into the container.

No image engine here: stand-ins for `docker` and `apptainer` answer `inspect` and run the
probe (and only the probe) with a real interpreter of this machine, the way the image's
Python would run it: /usr/bin/python3 has neither torch nor `train`, older ones (pyenv's,
where installed) are too old.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.golden.cases import script_step
from train.images import features
from train.images.features import Features
from train.node.nodeentry import LAUNCHER_ROOT

NO_SBATCH = "#!/bin/sh\necho 'sbatch: error: no cluster in unit tests' >&2\nexit 1\n"
# the engine's stand-in: `image inspect` says the id (IMAGE_ID) and no labels (or
# IMAGE_LABELS); `run ... IMAGE PYTHON -c CODE` runs PYTHON -c CODE here, and counts it
FAKE_DOCKER = """#!/bin/bash
if [ "$1" = image ] && [ "$2" = inspect ]; then
    echo "${IMAGE_ID:-sha256:feed} ${IMAGE_LABELS:-{\\}}"; exit 0
fi
if [ "$1" = run ]; then
    echo run >> "$PROBE_COUNT"
    while [ "$1" != env ]; do shift; done; shift 2  # to the image's command
    exec env -u PYTHONPATH "$@"  # (nothing of the host's environment)
fi
echo "docker stand-in: $*" >&2; exit 1
"""
FAKE_APPTAINER = """#!/bin/bash
if [ "$1" = inspect ]; then
    echo '{"data": {"attributes": {"labels": {}, "environment": {}}}}'; exit 0
fi
if [ "$1" = exec ]; then
    echo run >> "$PROBE_COUNT"
    shift 3; exec env -u PYTHONPATH "$@"  # exec --cleanenv IMAGE PYTHON -c CODE
fi
echo "apptainer stand-in: $*" >&2; exit 1
"""
NO_TORCH = "/usr/bin/python3"  # Debian's: neither torch nor `train`
PYENV = Path("/root/.pyenv/versions")


def _old_python(version: str) -> str | None:
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version.split('.', maxsplit=1)[0]}"))
    return str(found[0]) if found else shutil.which(f"python{version}")


def _engine(tmp_path: Path, runtime: str, **extra: str) -> dict[str, str]:
    sbin = tmp_path / "sbin"
    sbin.mkdir(exist_ok=True)
    for name, text in (("sbatch", NO_SBATCH), (runtime, FAKE_DOCKER if runtime == "docker"
                                               else FAKE_APPTAINER)):
        (sbin / name).write_text(text)
        (sbin / name).chmod(0o755)
    return {"PATH": f"{sbin}:{os.environ['PATH']}", "PROBE_COUNT": str(tmp_path / "probes"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"), "DOCKER_HOST": "", **extra}


def _job(tmp_path: Path, runtime: str, python: str, *flags: str) -> list[str]:
    image = "my/ngc:24.01"
    if runtime == "apptainer":
        sif = tmp_path / "ngc.sif"
        head = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0")
        sif.write_bytes(head + b"SIF_MAGIC\0" + b"01\0" + b"\0" * 1024)
        image = str(sif)
    (tmp_path / "prog.py").write_text("print('hi')\n")
    return ["--cluster", "local", "--cpus-per-task", "1", "--mem", "1000M", "--name", "byo",
            "--entry", "command", "--runtime", runtime, "--image", image, "--python", python,
            *flags, "--", "python3", str(tmp_path / "prog.py")]


def _probes(tmp_path: Path) -> int:
    path = tmp_path / "probes"
    return len(path.read_text().splitlines()) if path.exists() else 0


# -- the probe -----------------------------------------------------------------------------
def test_the_probe_reads_a_real_pythons_version_and_modules() -> None:
    import subprocess

    ours = subprocess.run([sys.executable, "-c", features.PROBE], capture_output=True,
                          text=True, timeout=120, check=True)
    found = features.parse_probe(ours.stdout)
    assert found.python == tuple(sys.version_info[:3])
    assert found.torch and found.train and found.pynvml
    assert found.train_version == __import__("train").__version__
    bare = subprocess.run([NO_TORCH, "-c", features.PROBE], capture_output=True, text=True,
                          timeout=120, check=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    plain = features.parse_probe(bare.stdout)
    assert (plain.torch, plain.train, plain.train_version) == (False, False, "")
    with pytest.raises(ValueError, match="no answer"):
        features.parse_probe("Traceback ...\nSyntaxError\n")


@pytest.mark.parametrize("version", ["2.7", "3.6"])
def test_the_probe_says_an_old_pythons_version(version: str) -> None:
    import subprocess

    python = _old_python(version)
    if python is None:  # (where pyenv's old interpreters are not installed)
        pytest.skip(f"no Python {version} here")
    proc = subprocess.run([python, "-c", features.PROBE], capture_output=True, text=True,
                          timeout=120, check=False)
    assert features.parse_probe(proc.stdout).python[:2] == tuple(map(int, version.split(".")))


def test_our_labels_answer_without_a_probe() -> None:
    ours = features.from_labels({"org.train.image": "base", "org.train.torch": "2.5"})
    assert ours is not None and ours.train and ours.torch
    assert features.from_labels({"maintainer": "NVIDIA"}) is None
    assert features.from_labels({"org.train.image": ""}) is None  # a derived image cleared it
    assert ours is not None and ours.ours


# -- submit: the cache, the refusals, the bind ---------------------------------------------
def test_the_answer_is_cached_per_image_identity(tmp_path: Path) -> None:
    env = _engine(tmp_path, "docker")
    for _ in range(2):
        proc = run_cli(["render", *_job(tmp_path, "docker", NO_TORCH, "--launch", "tasks")],
                       cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
    assert _probes(tmp_path) == 1  # the second render read the cache
    cache = (tmp_path / "cache" / "train" / "image-features.json").read_text()
    assert "sha256:feed" in cache and NO_TORCH in cache
    proc = run_cli(["render", *_job(tmp_path, "docker", NO_TORCH, "--launch", "tasks")],
                   cwd=tmp_path, env={**env, "IMAGE_ID": "sha256:other"})
    assert proc.returncode == 0 and _probes(tmp_path) == 2  # another image: asked again


def test_a_sif_is_known_by_path_size_and_time(tmp_path: Path) -> None:
    sif = tmp_path / "a.sif"
    sif.write_bytes(b"x" * 10)
    first = features.file_identity(str(sif))
    os.utime(sif, ns=(1, 1))
    assert first is not None and features.file_identity(str(sif)) != first
    assert features.file_identity(str(tmp_path / "none.sif")) is None


def _refused(tmp_path: Path, env: dict[str, str], args: list[str]) -> str:
    proc = run_cli(["submit", *args], cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "train: error: image: --image" in proc.stderr, proc.stderr
    assert "no cluster in unit tests" not in proc.stderr  # sbatch never ran
    assert not (tmp_path / "runs").exists()
    return proc.stderr


@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
def test_torchrun_in_an_image_without_torch_is_refused(tmp_path: Path, runtime: str) -> None:
    env = _engine(tmp_path, runtime)
    err = _refused(tmp_path, env, _job(tmp_path, runtime, NO_TORCH, "--launch", "torchrun"))
    assert "cannot import torch" in err and "--launch tasks" in err, err


def test_a_python_older_than_the_minimum_is_refused(tmp_path: Path) -> None:
    python = _old_python("3.8")
    if python is None:
        pytest.skip("no Python 3.8 here")
    env = _engine(tmp_path, "docker")
    err = _refused(tmp_path, env, _job(tmp_path, "docker", python, "--launch", "tasks"))
    assert "its Python is 3.8." in err and "needs Python >= 3.9" in err, err


def test_a_python_that_is_not_in_the_image_is_refused(tmp_path: Path) -> None:
    env = _engine(tmp_path, "docker")
    err = _refused(tmp_path, env, _job(tmp_path, "docker", "python3.99", "--launch", "tasks"))
    assert "its Python (python3.99) does not run in it" in err, err


def test_entry_train_needs_train_in_the_image(tmp_path: Path) -> None:
    env = _engine(tmp_path, "docker")
    args = _job(tmp_path, "docker", NO_TORCH, "--launch", "tasks")
    args = [*args[:args.index("--entry")], "--entry", "train",
            *args[args.index("--entry") + 2:args.index("--")], "--", "demo"]
    err = _refused(tmp_path, env, args)
    assert "has no `train` package" in err and "--entry command" in err, err


@pytest.mark.parametrize("launch", ["torchrun", "tasks"])
@pytest.mark.parametrize("entry", ["train", "command", "navsim"])
def test_an_image_our_labels_name_is_never_refused(entry: str, launch: str) -> None:
    """The labels answer without a probe, so the Python version is unknown: that is no
    reason to refuse an image built from our definitions (the CI base image was)."""
    from types import SimpleNamespace

    job = SimpleNamespace(spec=SimpleNamespace(image="train/base:ci", python="python3",
                                               entry=entry),
                          launch=launch, gpu_watch=object())
    ours = features.from_labels({"org.train.image": "base"})
    assert ours is not None
    assert features.problems(job, ours) == ([], [])  # type: ignore[arg-type]


def test_no_nvml_is_a_warning_not_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    job = SimpleNamespace(spec=SimpleNamespace(image="ngc", python="python3",
                                               entry="command"),
                          launch="tasks", gpu_watch=object())
    bare = Features(python=(3, 10, 1), torch=True, train=False, pynvml=False,
                    nvidia_smi=True)
    monkeypatch.setattr(features, "client_pynvml", lambda: None)
    refusals, warnings = features.problems(job, bare)  # type: ignore[arg-type]
    assert refusals == [] and "GPU watch is off" in warnings[0]
    assert "nvidia-smi is there" in warnings[0]
    monkeypatch.setattr(features, "client_pynvml", lambda: "/x/pynvml.py")
    assert features.problems(job, bare) == ([], [])  # type: ignore[arg-type]


@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
def test_an_image_without_train_gets_the_launcher_bound_read_only(
        tmp_path: Path, runtime: str) -> None:
    import train

    env = _engine(tmp_path, runtime)
    proc = run_cli(["render", *_job(tmp_path, runtime, NO_TORCH, "--launch", "tasks")],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    package = os.path.dirname(os.path.abspath(train.__file__))
    bind = f"{package}:{LAUNCHER_ROOT}/train:ro"
    flag = "-v" if runtime == "docker" else "--bind"
    argv = script_step(proc.stdout)
    assert any(arg == flag and nxt == bind for arg, nxt in itertools.pairwise(argv)), argv
    step = " ".join(argv)
    assert "sys.path.append(" in step and "train.node.nodeentry" in step
    assert "PYTHONPATH" not in step  # the program's environment is the image's own
    # an image of ours (its labels say so) runs its own `train`: nothing bound
    proc = run_cli(["render", *_job(tmp_path, "docker", NO_TORCH, "--launch", "tasks")],
                   cwd=tmp_path, env={**_engine(tmp_path, "docker"), "IMAGE_ID": "sha256:o",
                                      "IMAGE_LABELS": '{"org.train.image":"base"}'})
    assert proc.returncode == 0 and LAUNCHER_ROOT not in proc.stdout, proc.stderr


# -- what the probe or the cache may say: anything odd is no answer, never a traceback -----
_ODD = ['{"python": [3, 1e400]}', '{"python": "3.11"}', '{"python": [-1, 99]}',
        '{"python": [true, 11]}', '{"python": [3, 11], "torch": "false"}',
        '{"python": [3, 11], "train_version": 5}', '[]', '"x"',
        "[" * 100_000 + "]" * 100_000]


@pytest.mark.parametrize("answer", _ODD, ids=range(len(_ODD)))
def test_an_odd_probe_answer_is_no_answer(answer: str) -> None:
    with pytest.raises(ValueError):
        features.parse_probe(f"TRAIN-PROBE {answer}\n")


@pytest.mark.parametrize("entry", [
    '{"python": "311", "torch": true, "train": false, "pynvml": false, "nvidia_smi": false}',
    '{"python": [3, 11], "torch": "no", "train": false, "pynvml": false, '
    '"nvidia_smi": false}',
    '{"python": [3, 11], "torch": false, "train": false, "pynvml": false, '
    '"nvidia_smi": false, "ours": true}'], ids=["str-version", "str-bool", "ours"])
def test_an_odd_cache_entry_is_asked_again(tmp_path: Path, entry: str) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    path = features.cache_path(env)
    path.parent.mkdir(parents=True)
    path.write_text('{"k": ' + entry + "}")
    assert features.cached("k", env) is None
    path.write_text("[" * 100_000)  # cut short, or nested past the parser's depth
    assert features.cached("k", env) is None
    features.remember("k", Features(python=(3, 11, 0), torch=False, train=False,
                                    pynvml=False, nvidia_smi=False), env)
    assert features.cached("k", env) == Features((3, 11, 0), False, False, False, False)


def test_a_flood_from_the_image_is_cut_short_in_the_note(tmp_path: Path) -> None:
    env = _engine(tmp_path, "docker")
    docker = Path(env["PATH"].split(":")[0]) / "docker"
    docker.write_text(FAKE_DOCKER.replace('echo run >> "$PROBE_COUNT"',
                                          "printf 'x%.0s' $(seq 5000); exit 3"))
    proc = run_cli(["render", *_job(tmp_path, "docker", NO_TORCH, "--launch", "tasks")],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    note = next(ln for ln in proc.stderr.splitlines() if "could not be asked" in ln)
    assert len(note) < 600, len(note)


@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
def test_an_image_that_reads_as_an_option_is_refused(tmp_path: Path, runtime: str) -> None:
    # `docker run ... --entrypoint env -v/:/host python3 ...` would mount the host's root
    # and take the Python for the image
    env = _engine(tmp_path, runtime)
    args = _job(tmp_path, runtime, NO_TORCH, "--launch", "tasks")
    at = args.index("--image")
    args[at:at + 2] = ["--image=-v/:/host"]
    proc = run_cli(["render", *args], cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "train: error: image: " in proc.stderr and "'-'" in proc.stderr, proc.stderr
    assert _probes(tmp_path) == 0


@pytest.mark.parametrize("runtime", ["none", "apptainer"])
def test_a_python_that_reads_as_an_option_is_refused(tmp_path: Path, runtime: str) -> None:
    # `srun ... -i -c CODE` (runtime none) would take it for srun's own option
    image = ["--image", str(tmp_path / "x.sif")] if runtime == "apptainer" else []
    proc = run_cli(["render", "--cluster", "local", "--no-check", "--entry", "command",
                    "--runtime", runtime, *image, "--python=-i", "--", "true"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "train: error: python: '-i' starts with '-'" in proc.stderr, proc.stderr


def test_a_probe_that_hangs_is_one_short_note(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # the engine never answers: the note says so in a line, not the probe's whole program
    env = _engine(tmp_path, "docker")
    docker = Path(env["PATH"].split(":")[0]) / "docker"
    docker.write_text(FAKE_DOCKER.replace('echo run >> "$PROBE_COUNT"', "exec sleep 30"))
    monkeypatch.setattr(features, "PROBE_TIMEOUT", 0.5)
    found, notes = features._probe("docker", str(docker), "my/ngc:24.01", NO_TORCH,
                                   {**os.environ, **env})
    assert found is None and len(notes.splitlines()) == 1, notes
    assert "timed out after 0.5 s" in notes and "TRAIN-PROBE" not in notes, notes


def test_a_sif_apptainer_cannot_open_is_refused_before_any_probe(tmp_path: Path) -> None:
    """A SIF header on a file cut short: the login node's apptainer cannot open it, and the
    nodes' cannot either, so submit refuses it (the probe never runs)."""
    env = _engine(tmp_path, "apptainer")
    (tmp_path / "sbin" / "apptainer").write_text(
        "#!/bin/bash\nif [ \"$1\" = inspect ]; then echo 'FATAL:   could not open image "
        "x.sif: failed to retrieve path for x.sif: image format not recognized' >&2; "
        "exit 255; fi\necho run >> \"$PROBE_COUNT\"; exit 1\n")
    err = _refused(tmp_path, env, _job(tmp_path, "apptainer", NO_TORCH, "--launch", "tasks"))
    assert "`apptainer inspect" in err and "failed (exit 255)" in err, err
    assert "image format not recognized" in err and "not an image this apptainer" in err
    assert _probes(tmp_path) == 0


def test_a_python_missing_is_found_under_apptainers_closing_info_lines(tmp_path: Path) -> None:
    """Apptainer without squashfuse says what failed, then cleans up and says so: the line
    that names the missing Python is not the last one, and it is still a refusal."""
    env = _engine(tmp_path, "apptainer")
    fake = (tmp_path / "sbin" / "apptainer").read_text().replace(
        'if [ "$1" = exec ]; then',
        'if [ "$1" = exec ]; then\n    echo "INFO:    Converting SIF file to temporary '
        'sandbox..." >&2\n    echo "FATAL:   \\"python3\\": executable file not found in '
        '\\$PATH" >&2\n    echo "INFO:    Cleaning up image..." >&2; exit 255\n    fi\n'
        '    if false; then')
    (tmp_path / "sbin" / "apptainer").write_text(fake)
    err = _refused(tmp_path, env, _job(tmp_path, "apptainer", "python3", "--launch", "tasks"))
    assert "its Python (python3) does not run in it" in err, err
    assert "executable file not found" in err and "Cleaning up" not in err
