"""Bring your own image (issue 21, item 2): what submit finds out about an image without
our labels (its Python, torch, `train`, NVML), the cache of that answer, the refusals
(exit 2, nothing queued), and the client's launcher bound into the container.

No image engine here: stand-ins for `docker` and `apptainer` answer `inspect` and run the
probe (and only the probe) with a real interpreter of this machine, the way the image's
Python would run it: /usr/bin/python3 has neither torch nor `train`, older ones (pyenv's,
where installed) are too old.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.golden.cases import script_step
from train.client.slurm.checks import imagefit
from train.common.entry import LAUNCHER_ROOT
from train.images import features
from train.images.features import CACHE_MAX_BYTES, Features

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
    assert imagefit.problems(job, ours) == ([], [])  # type: ignore[arg-type]


def test_no_nvml_is_a_warning_not_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    job = SimpleNamespace(spec=SimpleNamespace(image="ngc", python="python3",
                                               entry="command"),
                          launch="tasks", gpu_watch=object())
    bare = Features(python=(3, 10, 1), torch=True, train=False, pynvml=False,
                    nvidia_smi=True)
    monkeypatch.setattr(imagefit, "client_pynvml", lambda: None)
    refusals, warnings = imagefit.problems(job, bare)  # type: ignore[arg-type]
    assert refusals == [] and "GPU watch is off" in warnings[0]
    assert "nvidia-smi is there" in warnings[0]
    monkeypatch.setattr(imagefit, "client_pynvml", lambda: "/x/pynvml.py")
    assert imagefit.problems(job, bare) == ([], [])  # type: ignore[arg-type]


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
    assert features.cached("k", env) == Features((3, 11, 0), False, False, False, False,
                                                 cache_file=str(path))


def test_a_nan_in_a_hand_edited_entry_does_not_freeze_the_cache(tmp_path: Path) -> None:
    """Python's JSON reads NaN (and 1e400 as inf); the strict write refuses both: NaN read
    as null and an entry holding inf left out, the cache is written with the new answer
    (at 05f6875 they were written back as NaN and Infinity), instead of never again, with
    every later submit asking the image."""
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    path = features.cache_path(env)
    path.parent.mkdir(parents=True)
    path.write_text('{"old": {"python": [3, 9, 1], "torch": false, "train": false, '
                    '"pynvml": false, "nvidia_smi": false, "note": NaN}, '
                    '"big": {"python": [3, 9, 1], "note": 1e400}}')
    found = Features(python=(3, 11, 0), torch=False, train=False, pynvml=False,
                     nvidia_smi=False)
    features.remember("k", found, env)
    assert features.cached("k", env) == dataclasses.replace(found, cache_file=str(path))
    assert features.cached("old", env) == Features((3, 9, 1), False, False, False, False,
                                                   cache_file=str(path))
    assert "big" not in json.loads(path.read_text())  # inf has no strict JSON: dropped


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


def test_a_probe_that_hangs_is_one_short_refusal(tmp_path: Path) -> None:
    # the engine never answers: the refusal says so in a line, not the probe's program
    env = _engine(tmp_path, "docker")
    docker = Path(env["PATH"].split(":")[0]) / "docker"
    docker.write_text(FAKE_DOCKER.replace('echo run >> "$PROBE_COUNT"', "exec sleep 30"))
    asked = features.run_probe("docker", str(docker), "my/ngc:24.01", NO_TORCH,
                               {**os.environ, **env}, 0.5)
    assert asked.found is None and len(asked.refusal.splitlines()) == 1, asked
    assert "did not answer in 0.5 s" in asked.refusal, asked
    assert "TRAIN-PROBE" not in asked.refusal and "import" not in asked.refusal, asked


# -- what the container sees: binds and --chdir ----------------------------------------------
@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
def test_a_read_only_bind_at_its_own_path_is_one_bind(tmp_path: Path, runtime: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    env = _engine(tmp_path, runtime)
    args = _job(tmp_path, runtime, NO_TORCH, "--launch", "tasks", "--bind",
                f"{data}:{data}:ro")
    proc = run_cli(["render", *args], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    argv = script_step(proc.stdout)
    flag = "-v" if runtime == "docker" else "--bind"
    shown = [nxt for arg, nxt in itertools.pairwise(argv)
             if arg == flag and nxt.split(":")[0] == str(data)]
    assert shown == [f"{data}:{data}:ro"], argv  # not also a writable `data` bind


def test_a_results_csv_under_a_read_only_bind_is_refused(tmp_path: Path) -> None:
    from train.client.clusters.profiles import Registry
    from train.client.slurm.jobspec import JobSpec
    from train.client.slurm.resolve import resolve
    from train.common.errors import ConfigError

    data = tmp_path / "data"
    data.mkdir()
    spec = JobSpec(cluster="local", runtime="docker", image="img:1",
                   out=str(tmp_path / "runs" / "d"), bind=(f"{data}:{data}:ro",),
                   workload=("demo", "--results-csv", str(data / "all.csv")))
    with pytest.raises(ConfigError) as err:
        resolve(spec, Registry(environ={}).get("local"))
    assert err.value.field == "results_csv", str(err.value)


def test_docker_refuses_a_chdir_it_does_not_bind(tmp_path: Path) -> None:
    code, data = tmp_path / "code", tmp_path / "data"
    code.mkdir()
    (data / "sub").mkdir(parents=True)
    env = _engine(tmp_path, "docker")
    args = _job(tmp_path, "docker", NO_TORCH, "--launch", "tasks", "--chdir", str(code))
    proc = run_cli(["render", *args], cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "train: error: chdir: " in proc.stderr and f"--bind {code}" in proc.stderr, \
        proc.stderr
    assert str(tmp_path / "runs" / "byo") in proc.stderr  # the binds it would see
    assert "Traceback" not in proc.stderr
    # bound elsewhere: still not at its own path inside
    moved = [*args[:args.index("--")], "--bind", f"{code}:/code", *args[args.index("--"):]]
    proc = run_cli(["render", *moved], cwd=tmp_path, env=env)
    assert proc.returncode == 2 and f"{code}:/code" in proc.stderr, proc.stderr
    # under a bind (read-only too), or under the run folder: started there
    for extra in (["--bind", f"{data}:{data}:ro", "--chdir", str(data / "sub")],
                  ["--chdir", str(code), "--bind", str(code)]):
        ok = _job(tmp_path, "docker", NO_TORCH, "--launch", "tasks", *extra)
        proc = run_cli(["render", *ok], cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
    # apptainer binds the working folder and home itself: not refused there
    app = _job(tmp_path, "apptainer", NO_TORCH, "--launch", "tasks", "--chdir", str(code))
    proc = run_cli(["render", *app], cwd=tmp_path, env=_engine(tmp_path, "apptainer"))
    assert proc.returncode == 0, proc.stderr


# -- a sandbox's kept answer follows what is installed into it -------------------------------
# the stand-in answers as the sandbox's Python would: torch where its dist-packages has it;
# the folders it names are what the real probe names (sys.path, site-packages, PATH)
SANDBOX_APPTAINER = """#!/bin/bash
if [ "$1" = exec ]; then
    echo run >> "$PROBE_COUNT"
    torch=false
    for d in usr/lib/python3/dist-packages usr/local/lib/python3.11/dist-packages; do
        if [ -d "$3/$d/torch" ]; then torch=true; fi
    done
    printf 'TRAIN-PROBE {"python": [3, 11, 2], "torch": %s, "train": false, ' "$torch"
    printf '"pynvml": false, "nvidia_smi": false, "paths": ["/usr/lib/python3.11", '
    printf '"/usr/lib/python3/dist-packages", "/usr/local/lib/python3.11/dist-packages", '
    printf '"/usr/bin", "/usr/bin/python3", "/usr/bin/python3.11"]}\\n'
    exit 0
fi
echo "apptainer stand-in: $*" >&2; exit 1
"""


def test_a_sandboxs_answer_is_asked_again_after_torch_is_installed_or_removed(
        tmp_path: Path) -> None:
    box = tmp_path / "box"
    (box / ".singularity.d").mkdir(parents=True)
    (box / ".singularity.d" / "labels.json").write_text("{}")
    (box / "usr" / "lib" / "python3" / "dist-packages").mkdir(parents=True)
    (box / "usr" / "lib" / "python3.11").mkdir(parents=True)
    (box / "usr" / "bin").mkdir(parents=True)
    (box / "usr" / "bin" / "python3.11").write_text("")
    (box / "usr" / "bin" / "python3").symlink_to("/usr/bin/python3.11")  # (absolute)
    env = _engine(tmp_path, "apptainer")
    (Path(env["PATH"].split(":")[0]) / "apptainer").write_text(SANDBOX_APPTAINER)
    args = _job(tmp_path, "apptainer", "python3", "--launch", "torchrun")
    args[args.index("--image") + 1] = str(box)

    def refused() -> str:
        proc = run_cli(["render", *args], cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        return "\n".join(ln for ln in proc.stderr.splitlines() if "cannot import torch" in ln)

    cache = tmp_path / "cache" / "train" / "image-features.json"
    assert refused() and _probes(tmp_path) == 1
    said = refused()  # the kept answer: it says where it is kept
    assert _probes(tmp_path) == 1 and str(cache) in said and "remove" in said, said
    site = box / "usr" / "lib" / "python3" / "dist-packages"
    (site / "torch").mkdir()
    assert not refused() and _probes(tmp_path) == 2  # installed: asked again
    assert not refused() and _probes(tmp_path) == 2
    (site / "torch").rmdir()
    assert refused() and _probes(tmp_path) == 3  # removed: asked again
    # a site-packages folder that was not there yet
    (box / "usr" / "local" / "lib" / "python3.11" / "dist-packages" / "torch").mkdir(
        parents=True)
    assert not refused() and _probes(tmp_path) == 4
    # another interpreter put in place of the old one
    (box / "usr" / "bin" / "python3.11").unlink()
    (box / "usr" / "bin" / "python3.11").write_text("#")
    assert not refused() and _probes(tmp_path) == 5


def test_the_probe_names_the_folders_that_decide_its_answer() -> None:
    import importlib.util
    import subprocess

    ours = subprocess.run([sys.executable, "-c", features.PROBE], capture_output=True,
                          text=True, timeout=120, check=True)
    paths = [p for p, _ in features.parse_probe(ours.stdout).watch]
    torch = importlib.util.find_spec("torch")
    assert torch is not None and torch.submodule_search_locations
    site = os.path.dirname(next(iter(torch.submodule_search_locations)))
    assert site in paths and os.path.realpath(sys.executable) in paths, paths
    # a path inside a sandbox is looked up there, its links followed inside it
    stamps = dict(features.sandbox_stamps("/", [site, "/no/such/folder"]))
    assert stamps[site] and not stamps[site].startswith("-")
    assert stamps["/no/such/folder"].startswith("-")  # the folder above, where it would go


# -- a cache file that is not a regular file -------------------------------------------------
def test_a_cache_that_is_a_fifo_or_a_device_is_no_cache(tmp_path: Path) -> None:
    env = _engine(tmp_path, "docker")
    cache = tmp_path / "cache" / "train" / "image-features.json"
    cache.parent.mkdir(parents=True)
    args = _job(tmp_path, "docker", NO_TORCH, "--launch", "tasks")
    os.mkfifo(cache)
    for probes in (1, 2):  # (a FIFO that nothing writes: the old reader waited forever)
        proc = run_cli(["render", *args], cwd=tmp_path, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        said = [ln for ln in proc.stderr.splitlines() if str(cache) in ln]
        assert len(said) == 1 and "not a regular file" in said[0], proc.stderr
        assert _probes(tmp_path) == probes  # asked each time, never kept
        assert cache.is_fifo()  # not written over
    cache.unlink()
    cache.symlink_to("/dev/zero")  # (the old reader read it until MemoryError)
    proc = run_cli(["render", *args], cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "not a regular file (a device)" in proc.stderr, proc.stderr
    assert cache.is_symlink() and os.readlink(cache) == "/dev/zero"
    cache.unlink()
    cache.write_bytes(b" " * (CACHE_MAX_BYTES + 1))
    proc = run_cli(["render", *args], cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0 and "larger than 1 MiB" in proc.stderr, proc.stderr
    assert cache.stat().st_size == CACHE_MAX_BYTES + 1


# -- an image whose Python hangs -------------------------------------------------------------
# the engine's stand-in whose Python never answers: it starts a child that sleeps (as a
# container runtime's CLI has children) and waits; every pid goes to $PIDS
HANGING = """#!/bin/bash
if [ "$1" = image ] && [ "$2" = inspect ]; then echo "sha256:hang {}"; exit 0; fi
if [ "$1" = inspect ]; then
    echo '{"data": {"attributes": {"labels": {}, "environment": {}}}}'; exit 0
fi
if [ "$1" = rm ]; then echo "$*" >> "$REMOVED"; exit 0; fi
if [ "$1" = run ] || [ "$1" = exec ]; then
    echo run >> "$PROBE_COUNT"
    printf '%s\n' "$@" > "$PROBE_COUNT.argv"
    echo $$ >> "$PIDS"
    sleep 3600 > /dev/null 2>&1 &
    echo $! >> "$PIDS"
    wait
fi
exit 1
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # (a zombie no one reaped yet is gone all the same)


@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
def test_an_image_whose_python_hangs_is_asked_once_and_refused(tmp_path: Path,
                                                                runtime: str) -> None:
    env = _engine(tmp_path, runtime, TRAIN_PROBE_TIMEOUT="2", PIDS=str(tmp_path / "pids"),
                  REMOVED=str(tmp_path / "removed"))
    (Path(env["PATH"].split(":")[0]) / runtime).write_text(HANGING)
    err = _refused(tmp_path, env, _job(tmp_path, runtime, NO_TORCH, "--launch", "tasks"))
    assert "its Python (/usr/bin/python3) did not answer in 2 s" in err, err
    assert "TRAIN_PROBE_TIMEOUT=SECONDS" in err and "--no-check" in err, err
    assert _probes(tmp_path) == 1
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 2 and not any(map(_alive, pids)), pids  # the whole group killed
    if runtime == "docker":  # the engine's container, outside that group: removed
        run = (tmp_path / "probes.argv").read_text().splitlines()
        name = run[run.index("--name") + 1]
        assert (tmp_path / "removed").read_text().split() == ["rm", "-f", name]
    # render: warned once, asked once (not again to bind the launcher)
    proc = run_cli(["render", *_job(tmp_path, runtime, NO_TORCH, "--launch", "tasks")],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "did not answer in 2 s" in proc.stderr, proc.stderr
    assert _probes(tmp_path) == 2
    assert not any(map(_alive, [int(p) for p in (tmp_path / "pids").read_text().split()]))


def test_a_probe_timeout_that_is_not_seconds_is_refused(tmp_path: Path) -> None:
    env = _engine(tmp_path, "docker", TRAIN_PROBE_TIMEOUT="soon")
    proc = run_cli(["submit", *_job(tmp_path, "docker", NO_TORCH, "--launch", "tasks")],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "train: error: image: TRAIN_PROBE_TIMEOUT='soon'" in proc.stderr, proc.stderr
    assert "a number > 0" in proc.stderr and not (tmp_path / "runs").exists()
    assert _probes(tmp_path) == 0


def test_a_command_that_times_out_leaves_no_process(tmp_path: Path) -> None:
    from train.common import _proc

    pids = tmp_path / "pids"
    with pytest.raises(_proc.ProcError) as err:
        _proc.run(["bash", "-c", f"echo $$ >> {pids}; sleep 3600 >/dev/null 2>&1 & "
                   f"echo $! >> {pids}; wait"], timeout=2)
    assert err.value.timed_out and err.value.returncode == 124
    found = [int(p) for p in pids.read_text().split()]
    # SIGKILL to the group is sent at the timeout; a loaded machine may take a moment to
    # run the kernel's end of a killed process (the wait is for that, never for work)
    for _ in range(100):
        if not any(map(_alive, found)):
            break
        time.sleep(0.1)
    assert len(found) == 2 and not any(map(_alive, found)), found


ENGINE_HUNG = """#!/bin/bash
echo "$*" >> "$PROBE_COUNT"
echo $$ >> "$PIDS"
sleep 3600 > /dev/null 2>&1 &
echo $! >> "$PIDS"
wait
"""


def test_a_hung_engine_is_waited_on_once_per_command(tmp_path: Path) -> None:
    """A Docker engine that never answers: render waits on it once (TRAIN_PROBE_TIMEOUT),
    not once per question, and nothing of it is left running."""
    env = _engine(tmp_path, "docker", TRAIN_PROBE_TIMEOUT="2", PIDS=str(tmp_path / "pids"))
    (Path(env["PATH"].split(":")[0]) / "docker").write_text(ENGINE_HUNG)
    proc = run_cli(["render", *_job(tmp_path, "docker", NO_TORCH, "--launch", "tasks")],
                   cwd=tmp_path, env=env, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    asked = (tmp_path / "probes").read_text().splitlines()
    assert len(asked) == 1, asked  # every later question of the same command: not asked
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert pids and not any(map(_alive, pids)), pids


def test_term_to_train_ends_the_program_it_waits_on(tmp_path: Path) -> None:
    """`train render` ended by TERM while a hung engine is asked: the engine's whole
    process group ends with it (as for Ctrl-C)."""
    import signal
    import subprocess
    import time

    env = _engine(tmp_path, "docker", TRAIN_PROBE_TIMEOUT="600",
                  PIDS=str(tmp_path / "pids"))
    (Path(env["PATH"].split(":")[0]) / "docker").write_text(ENGINE_HUNG)
    proc = subprocess.Popen([sys.executable, "-m", "train", "render",
                             *_job(tmp_path, "docker", NO_TORCH, "--launch", "tasks")],
                            cwd=tmp_path, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids_file = tmp_path / "pids"
    for _ in range(600):  # until the engine's stand-in and its child run
        if pids_file.exists() and len(pids_file.read_text().split()) == 2:
            break
        time.sleep(0.1)
    pids = [int(p) for p in pids_file.read_text().split()]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    for _ in range(600):  # (SIGKILLed processes on two busy cores: up to a minute to exit)
        if not any(map(_alive, pids)):
            break
        time.sleep(0.1)
    assert not any(map(_alive, pids)), pids


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
