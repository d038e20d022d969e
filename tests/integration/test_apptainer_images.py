"""Every path a user's image takes, under the real Apptainer 1.4 (ci/sid-apptainer.sh), as an
ordinary user: CI's base converted to a SIF, base.def built by Apptainer itself on it, a
derived image (`train image new`) built and run in a job, submit's label reading and the
probe of a foreign image (and its cache), `train doctor --preflight`'s image check, and the
faults the login node can tell (a SIF cut short, a file that is no SIF, no Python)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, tiny_flags
from tests.integration.chains import TERMINAL, assert_complete
from tests.integration.chains import logs as _logs
from tests.integration.conftest import SiteUser
from tests.unit.test_image_derive import make_wheel
from train.client.preflight.result import IMAGE

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.slow]
# what a login shell may hold that must not reach the training (as in test_launch.py)
HOST_LEAKS = {"PYTHONPATH": "/nonexistent", "CONDA_PREFIX": "/opt/conda/envs/gpu"}


def _labels(user: SiteUser, sif: Path) -> dict[str, str]:
    inspect = user.run(["apptainer", "inspect", "--json", "--labels", str(sif)],
                       cwd=sif.parent)
    assert inspect.returncode == 0, inspect.stderr
    labels: dict[str, str] = json.loads(inspect.stdout)["data"]["attributes"]["labels"]
    return labels


def _exec(user: SiteUser, sif: Path, *argv: str) -> tuple[int, str]:
    proc = user.run(["apptainer", "exec", str(sif), *argv], cwd=sif.parent)
    return proc.returncode, proc.stdout + proc.stderr


def test_ci_sif_is_the_ci_base_with_its_labels_and_train(site_user: SiteUser,
                                                        ci_sif: Path) -> None:
    """The Docker-built base converted by Apptainer: its labels read by `apptainer inspect`,
    its venv's train and torch run as the user."""
    labels = _labels(site_user, ci_sif)
    assert labels["org.train.image"] == "base"
    assert labels["org.train.lock"] == "base-cpu.txt"
    code, out = _exec(site_user, ci_sif, "python", "-c",
                      "import torch, train; print('torch', torch.__version__)")
    assert code == 0 and "torch 2.13.0+cpu" in out, out
    assert ci_sif.stat().st_uid == site_user.uid


@pytest.fixture(scope="module")
def base_sandbox(site_user: SiteUser, apptainer_sif: Path) -> Path:
    """The Apptainer-built base unpacked once into a sandbox of the user's: without
    squashfuse every `apptainer exec` of the 1 GB SIF unpacks it again."""
    work = site_user.folder("sandbox")
    sandbox = work / "base"
    build = site_user.run(["apptainer", "build", "--sandbox", str(sandbox),
                           str(apptainer_sif)], cwd=work, timeout=1200)
    assert build.returncode == 0, build.stderr[-2000:]
    return sandbox


def test_base_def_built_by_apptainer_runs_every_section_under_apptainers_rules(
        site_user: SiteUser, apptainer_sif: Path, ci_sif: Path, base_sandbox: Path) -> None:
    """base.def built by `apptainer build --fakeroot` on the CI base's SIF: %labels (with
    the header's base argument naming the SIF), %environment, %runscript, %files (the
    clone's lock, not the base's) and %test, with the smoke run inside."""
    assert apptainer_sif.stat().st_uid == site_user.uid
    record = json.loads(apptainer_sif.with_suffix(".build.json").read_text())
    assert record["engine"] == "apptainer" and record["from"] == str(ci_sif)
    assert record["image_digest"].startswith("sha256:")
    labels = _labels(site_user, apptainer_sif)
    assert labels["org.train.image"] == "base"
    assert labels["org.train.lock"] == "base-cpu.txt"
    assert labels["org.train.torch"] == "2.13.0"
    assert labels["org.train.base-image"] == str(ci_sif)
    # %environment, and %files: the lock copied as one exact file onto the base's (a
    # directory copied onto the base's folder would nest inside it, and %post would
    # install the base's old lock); what %post staged and removed is gone
    lock = REPO / "containers" / "requirements" / "base-cpu.txt"
    code, out = _exec(site_user, base_sandbox, "sh", "-c",
                      "echo PATH=$PATH; echo UNBUF=$PYTHONUNBUFFERED; "
                      "echo ALLOC=$PYTORCH_CUDA_ALLOC_CONF; "
                      "sha256sum /opt/train/requirements/base-cpu.txt; "
                      "test ! -e /opt/train/requirements/requirements && "
                      "test ! -e /opt/train/wheelhouse && test ! -e /opt/train/src && "
                      "echo files-ok")
    assert code == 0 and "files-ok" in out, out
    assert "PATH=/opt/venv/bin:" in out and "UNBUF=1" in out
    assert "ALLOC=expandable_segments:True" in out
    assert hashlib.sha256(lock.read_bytes()).hexdigest() in out
    run = site_user.run(["apptainer", "run", str(base_sandbox), "--version"],
                        cwd=base_sandbox.parent)  # %runscript
    assert run.returncode == 0 and run.stdout.startswith("train "), run.stdout + run.stderr
    test = site_user.cli(["image", "test", "base", "--engine", "apptainer", "--out",
                          str(apptainer_sif)], cwd=apptainer_sif.parent, timeout=1200)
    assert test.returncode == 0, test.stderr[-3000:]
    assert "torch 2.13.0+cpu" in test.stdout  # %test ran
    assert "run complete" in test.stdout  # and the demo trained inside


def test_apptainer_test_fails_when_any_check_of_its_test_fails(
        site_user: SiteUser, base_sandbox: Path) -> None:
    """numpy removed from the sandbox of the built base breaks the first of base.def's
    %test checks (not the last: `set -e`), and `apptainer test` fails. (The last test to
    use the sandbox: it is left broken.)"""
    work = base_sandbox.parent
    test = site_user.run(["apptainer", "test", str(base_sandbox)], cwd=work)
    assert test.returncode == 0, test.stdout + test.stderr
    numpy = sorted(base_sandbox.glob("opt/venv/lib/python3*/site-packages/numpy"))
    assert numpy
    remove = site_user.run(["rm", "-rf", *map(str, numpy)], cwd=work)
    assert remove.returncode == 0, remove.stderr
    test = site_user.run(["apptainer", "test", str(base_sandbox)], cwd=work)
    assert test.returncode != 0, test.stdout
    assert "No module named 'numpy'" in test.stdout + test.stderr


DERIVED_JOB = """import derived_extra, torch, train
print("derived", derived_extra.VERSION, "torch", torch.__version__, "train", train.__version__)
"""


def test_a_derived_image_built_by_apptainer_runs_a_job(site_user: SiteUser,
                                                       ci_sif: Path) -> None:
    """`train image new`, `train image build --engine apptainer` on the base's SIF (the
    definition's BASE_SIF argument), then a 1-node job in it on the site's cluster: the
    added package and the base's torch are both there, and the base's labels the derived
    definition does not set are kept (localimage)."""
    work = site_user.folder("derived")
    (work / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "0"\n',
                                         encoding="utf-8")
    index = work / "index"
    index.mkdir()
    wheel = make_wheel(index, "derived-extra", "0.1")
    (work / "requirements.txt").write_text("derived-extra==0.1\n", encoding="utf-8")
    new = site_user.cli(["image", "new", "derived", "--requirements", "requirements.txt",
                         "--find-links", str(index), "--out", "containers-derived"], cwd=work)
    assert new.returncode == 0, new.stderr
    shutil.copy(wheel, work / "containers-derived" / "wheels")  # an offline build
    sif = work / "derived.sif"
    start = time.monotonic()
    build = site_user.cli(["image", "build", "containers-derived/derived.def", "--engine",
                           "apptainer", "--fakeroot", "--build-arg", f"BASE_SIF={ci_sif}",
                           "--out", str(sif)], cwd=work, timeout=1800)
    print(f"derived.def on ci_sif, apptainer build --fakeroot: "
          f"{time.monotonic() - start:.0f} s")
    assert build.returncode == 0, (build.stdout + build.stderr)[-3000:]
    labels = _labels(site_user, sif)
    assert labels["org.train.image"] == "derived" and labels["org.train.from"] == "base"
    assert labels["org.train.torch"] == "2.13.0"  # the base's, kept
    test = site_user.run(["apptainer", "test", str(sif)], cwd=work)
    assert test.returncode == 0, test.stdout + test.stderr
    (work / "derived_job.py").write_text(DERIVED_JOB, encoding="utf-8")
    name = "derivedjob"
    proc = site_user.cli(
        ["submit", "--name", name, "--cluster", "local", "--entry", "command", "--nodes",
         "1", "--cpus-per-task", "1", "--mem", "1000M", "--time", "5", "--runtime",
         "apptainer", "--image", str(sif), "--launch", "tasks", "--max-chunks", "1",
         "--", "python", str(work / "derived_job.py")], cwd=work)
    assert proc.returncode == 0, proc.stderr
    st = site_user.wait(work, name, lambda s: s["state"] in TERMINAL)
    out = _logs(work / "runs" / name, "out")
    assert_complete(st, work / "runs" / name)
    assert "derived 0.1 torch 2.13.0+cpu train " in out, out


def test_a_two_node_demo_in_the_apptainer_built_base_keeps_the_host_environment_out(
        site_user: SiteUser, apptainer_sif: Path) -> None:
    """`--entry train` in the base image Apptainer built, on both nodes of the site's
    cluster: the demo completes with world size 2, and the login shell's PYTHONPATH does not
    reach the training (apptainer exec --cleanenv)."""
    work = site_user.folder("appdemo")
    proc = site_user.cli(["submit", "--name", "app", "--cluster", "local", "--runtime",
                          "apptainer", "--image", str(apptainer_sif), "--nodes", "2",
                          "--cpus-per-task", "1", "--mem", "2000M", "--time", "10", "--",
                          "demo", "--episodes", "3", *tiny_flags()], cwd=work,
                         env=HOST_LEAKS)
    assert proc.returncode == 0, proc.stderr
    st = site_user.wait(work, "app", lambda s: s["state"] in TERMINAL)
    run_dir = work / "runs" / "app"
    assert_complete(st, run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["process_env"]["PYTHONPATH"] is None
    assert config["world_size"] == 2


def _submit(user: SiteUser, work: Path, image: Path, *flags: str,
            env: dict[str, str] | None = None) -> Any:
    (work / "prog.py").write_text("print('hi')\n", encoding="utf-8")
    return user.cli(["submit", "--name", "probe", "--cluster", "local", "--cpus-per-task",
                     "1", "--mem", "1000M", "--time", "5", "--runtime", "apptainer",
                     "--image", str(image), *flags, "--", "python3", str(work / "prog.py")],
                    cwd=work, env=env)


def _refused(proc: Any, work: Path) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (work / "runs").exists()  # nothing written, nothing queued
    return str(proc.stderr)


def test_submit_reads_our_labels_and_probes_a_foreign_image_once(
        site_user: SiteUser, ci_sif: Path, plain_sif: Path) -> None:
    """Our image's labels (apptainer inspect) answer without a probe; the plain image is
    probed (its Python 3.11, no torch, no train) and the answer is cached by the SIF's
    identity: a cache entry edited to an old Python is what the next submit believes."""
    work = site_user.folder("labels")
    cache = work / "cache"
    env = {"XDG_CACHE_HOME": str(cache)}
    (work / "prog.py").write_text("print('hi')\n", encoding="utf-8")
    ours = site_user.cli(["render", "--name", "ours", "--cluster", "local", "--runtime",
                          "apptainer", "--image", str(ci_sif), "--entry", "train", "--launch",
                          "torchrun", "--", "demo"], cwd=work, env=env)
    # (render runs submit's checks and prints what submit would refuse; nothing is queued)
    assert ours.returncode == 0, ours.stderr
    assert "would refuse" not in ours.stdout + ours.stderr, ours.stderr
    assert not (cache / "train" / "image-features.json").exists()  # never probed
    err = _refused(_submit(site_user, work, plain_sif, "--entry", "command", "--launch",
                           "torchrun", env=env), work)
    assert "cannot import torch" in err and "3.11" in err, err
    entries = json.loads((cache / "train" / "image-features.json").read_text())
    [key] = entries
    assert key.startswith(f"apptainer|python3|{plain_sif}:")
    assert entries[key]["python"][:2] == [3, 11] and entries[key]["train"] is False
    entries[key]["python"] = [3, 8, 0]
    (cache / "train" / "image-features.json").write_text(json.dumps(entries))
    err = _refused(_submit(site_user, work, plain_sif, "--entry", "command", "--launch",
                           "tasks", env=env), work)
    assert "its Python is 3.8.0" in err, err


def _truncated(user: SiteUser, plain_sif: Path) -> Path:
    folder = user.folder("faults")
    cut = folder / "cut.sif"
    with plain_sif.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(plain_sif.stat().st_size // 2))
    garbage = folder / "garbage.sif"
    garbage.write_bytes(b"this is not an image\n" * 100)
    return folder


NO_PYTHON_DEF = """Bootstrap: localimage
From: {base}

%files
    data /usr/share/data
    data /usr/share/data

%post
    rm -f /usr/bin/python3*

%test
    set -e
    test -f /usr/share/data/a.txt
    test -f /usr/share/data/data/a.txt
    ! command -v python3
"""


@pytest.fixture(scope="module")
def no_python_sif(site_user: SiteUser, plain_sif: Path) -> Path:
    """The plain image with its Python removed by %post, built (and %test run) by
    `apptainer build` as the user. Its %files copy one folder twice: the second `cp -fLr`
    puts it inside the first, Apptainer's rule that the Docker translation follows
    (test_images.py: a directory copied onto an existing one nests)."""
    folder = site_user.folder("nopython")
    (folder / "data").mkdir()
    (folder / "data" / "a.txt").write_text("a\n", encoding="utf-8")
    definition = folder / "nopython.def"
    definition.write_text(NO_PYTHON_DEF.format(base=plain_sif), encoding="utf-8")
    start = time.monotonic()
    proc = site_user.run(["apptainer", "build", str(folder / "nopython.sif"),
                          str(definition)], cwd=folder, timeout=1200)
    print(f"no-python SIF (on plain_sif): {time.monotonic() - start:.0f} s")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "Running testscript" in proc.stdout + proc.stderr  # %test ran at build time
    return folder / "nopython.sif"


def test_faults_are_refused_at_submit_naming_what_is_wrong(
        site_user: SiteUser, plain_sif: Path, no_python_sif: Path) -> None:
    """A SIF cut short, a file named .sif that is none, an image without its Python: each
    refused at submit (exit 2, nothing queued), never a hang or a traceback."""
    folder = _truncated(site_user, plain_sif)
    work = site_user.folder("faultsubmit")
    err = _refused(_submit(site_user, work, folder / "cut.sif", "--entry", "command",
                           "--launch", "tasks"), work)
    assert "cut.sif is cut short: its SIF header says it holds" in err, err
    err = _refused(_submit(site_user, work, folder / "garbage.sif", "--entry", "command",
                           "--launch", "tasks"), work)
    assert "garbage.sif is not a SIF image" in err, err
    err = _refused(_submit(site_user, work, no_python_sif, "--entry", "command", "--launch",
                           "tasks"), work)
    assert "its Python (python3) does not run in it" in err, err
    assert "--python" in err


def _preflight(user: SiteUser, image: Path, cwd: Path) -> dict[str, Any]:
    proc = user.cli(["doctor", "--preflight", "--cluster", "local", "--runtime", "apptainer",
                     "--image", str(image), "--json"], cwd=cwd)
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    checks = json.loads(proc.stdout)["checks"]
    [image_check] = [c for c in checks if c["name"] == IMAGE]
    return image_check  # type: ignore[no-any-return]


def test_preflight_opens_real_sifs_and_explains_the_faults(
        site_user: SiteUser, ci_sif: Path, plain_sif: Path, no_python_sif: Path) -> None:
    work = site_user.folder("preflight")
    ours = _preflight(site_user, ci_sif, work)
    assert ours["status"] == "pass", ours
    assert "opens (apptainer inspect) [org.train.image=base, org.train.lock=base-cpu.txt" \
        in ours["detail"]
    plain = _preflight(site_user, plain_sif, work)
    assert plain["status"] in ("pass", "warn"), plain
    assert "not one of our images: its Python (python3) is 3.11." in plain["detail"]
    assert "train no, torch no" in plain["detail"]
    folder = _truncated(site_user, plain_sif)
    cut = _preflight(site_user, folder / "cut.sif", work)
    assert cut["status"] == "fail" and "is cut short" in cut["detail"], cut
    garbage = _preflight(site_user, folder / "garbage.sif", work)
    assert garbage["status"] == "fail" and "is not a SIF image" in garbage["detail"]
    nopy = _preflight(site_user, no_python_sif, work)
    assert nopy["status"] == "fail", nopy
    assert "its Python (python3) does not run in it" in nopy["detail"], nopy
    assert "--python" in nopy["fix"]
