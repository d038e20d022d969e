"""The sites' own apptainer steps on the apptainer tier's cluster (Apptainer 1.4, Slurm
26.05, an ordinary user): each shipped site profile's modules, binds and flags over the
local partition (a profile `extends: local` with the site's keys copied from the shipped
one), in both launch modes, through a walltime stop and a resume. The sites' shared file
systems (/apps, /scratch, /depot, ...) are user folders bound at those paths in the
cluster's mount namespace. Each chain also checks what the container brought in: nothing
of the submitting shell's (PYTHONPATH, VIRTUAL_ENV, LD_LIBRARY_PATH, PYTHONSTARTUP,
APPTAINER_BIND, APPTAINERENV_*), no usercustomize from a planted ~/.local site-packages,
the unpacked image under the node's TMPDIR and removed after; and the GPU watch's bound
sampler starting in the image and stopping (no NVML here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.chains import TERMINAL, assert_complete, walltime_signal
from tests.integration.chains import logs as _logs
from tests.integration.conftest import SiteUser
from train.batch.task import NV_NO_DRIVER
from train.client.clusters.profiles import Registry

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.slow]

PLAIN = REPO / "tests" / "integration" / "plain_steps.py"
SITES = ("gilbreth", "rivanna", "torch")
SITE_DIRS = ("/apps", "/scratch", "/depot", "/project", "/standard", "/vast")


def _in_namespace(user: SiteUser, script: str, *args: str) -> None:
    """A shell script as root in the cluster's mount namespace (the sid root)."""
    pid = (user.as_user.parent.parent / "mntns.pid").read_text().strip()
    subprocess.run(["nsenter", "--target", pid, "--mount", "--root", "--", "sh", "-c",
                    script, "sh", *args], check=True, timeout=60, capture_output=True)


@pytest.fixture(scope="module")
def site_fs(site_user: SiteUser) -> Iterator[Path]:
    """The sites' shared file systems on the nodes: a user folder each, bound at the
    site's path (the root keeps the empty mount points)."""
    src = site_user.folder("sitefs")
    for path in SITE_DIRS:
        (src / path.lstrip("/")).mkdir()
        os.chown(src / path.lstrip("/"), site_user.uid, site_user.uid)
    _in_namespace(site_user, 'src=$1; shift; for d in "$@"; do mkdir -p "$d"; '
                  'mountpoint -q "$d" || mount --bind "$src$d" "$d"; done',
                  str(src), *SITE_DIRS)
    yield src
    _in_namespace(site_user, 'for d in "$@"; do umount -l "$d" 2>/dev/null; done; true',
                  *SITE_DIRS)


def site_profile(folder: Path, site: str) -> str:
    """`SITE-here`: the local cluster's partition with the site's apptainer keys."""
    shipped = Registry(environ={}).get(site)
    data = {"name": f"{site}-here", "extends": "local",
            "description": f"{site}'s modules, binds and scratch on the local cluster",
            "modules": list(shipped.modules), "binds": list(shipped.binds),
            "scratch_root": shipped.scratch_root, "nccl_env": dict(shipped.nccl_env)}
    (folder / f"{site}-here.yaml").write_text(json.dumps(data))  # (JSON is YAML)
    return f"{site}-here"


@pytest.fixture
def poisoned(site_user: SiteUser) -> Iterator[dict[str, str]]:
    """The submitting shell's environment with everything that could change what the
    program imports or loads, and a usercustomize in the user's ~/.local site-packages."""
    poison = site_user.folder("poison")
    (poison / "poisonmod.py").write_text("LEAKED = True\n")
    (poison / "startup.py").write_text("print('PYTHONSTARTUP ran')\n")
    home = site_user.as_user.parent.parent / "home"
    user_site = home / ".local" / "lib" / "python3.11" / "site-packages"
    user_site.mkdir(parents=True, exist_ok=True)
    # (silent: the login node's own Python imports it too, as the user's Python would)
    (user_site / "usercustomize.py").write_text("LEAKED = True\n")
    for path in (home / ".local", *user_site.parents, user_site,
                 user_site / "usercustomize.py"):
        if path.is_relative_to(home / ".local"):
            os.chown(path, site_user.uid, site_user.uid)
    yield {"PYTHONPATH": str(poison), "VIRTUAL_ENV": str(poison),
           "LD_LIBRARY_PATH": str(poison), "PYTHONSTARTUP": str(poison / "startup.py"),
           "POISON_MARK": "1", "APPTAINER_BIND": f"{poison}:/opt/poison",
           "APPTAINERENV_POISON_MARK": "1", "SINGULARITYENV_PYTHONPATH": str(poison)}
    shutil.rmtree(home / ".local", ignore_errors=True)


def _chain(user: SiteUser, site: str, sif: Path, launch: str,
           env: dict[str, str]) -> tuple[dict[str, Any], Path, Path]:
    """A 2-node chain of plain_steps.py under SITE-here, stopped by the walltime signal
    while both ranks hold, resumed: (its last status, its run folder, the node TMPDIR it
    ran with). In tasks mode with a fake GPU a node (--nv on nodes without a driver); in
    torchrun mode without (the CI image's torch is a CPU build, and `train launch` rightly
    refuses a GPU step it cannot use)."""
    gpus = ["--gpus-per-node", "1"] if launch == "tasks" else []
    work = user.folder(f"{site}-{launch}")
    shutil.copy(PLAIN, work / "plain_steps.py")
    (work / "profiles").mkdir()
    cluster = site_profile(work / "profiles", site)
    node_tmp = work / "node-tmp"
    node_tmp.mkdir()
    for path in (work / "profiles", node_tmp):
        os.chown(path, user.uid, user.uid)
    name = f"{site}-{launch}"
    proc = user.cli(
        ["submit", "--name", name, "--cluster", cluster, "--entry", "command",
         "--nodes", "2", *gpus, "--cpus-per-task", "1",
         # (torch's launcher, its worker and torch: a step killed at 1000M, exit 137)
         "--mem", "1000M" if launch == "tasks" else "3000M",
         "--time", "5", "--runtime", "apptainer", "--image", str(sif), "--launch", launch,
         "--stop-signal", "USR1", "--max-chunks", "3", "--env", "USER_HOLD_AT",
         "--", "python3", str(work / "plain_steps.py")],
        cwd=work, env={**env, "USER_HOLD_AT": "7", "TMPDIR": str(node_tmp),
                       "TRAIN_CLUSTERS_PATH": str(work / "profiles")})
    assert proc.returncode == 0, proc.stderr
    run_dir = work / "runs" / name
    held = [run_dir / "user_held-0", run_dir / "user_held-1"]
    st = user.wait(work, name, lambda s: all(p.exists() for p in held)
               or s["state"] in TERMINAL)
    assert all(p.exists() for p in held), (st, _logs(run_dir, "err")[-4000:])
    job_id = st["chunks"][0]["job_id"]
    # each rank's image unpacked in its task's own folder under the node's TMPDIR
    # (each task's own TMPDIR, a train-job.* folder, holds its unpacked image)
    unpacked = sorted(node_tmp.glob(f"**/train-apptainer-{job_id}.*/rootfs-*"))
    assert len(unpacked) == 2, sorted(str(p.relative_to(node_tmp))
                                      for p in node_tmp.rglob("*"))[:20]
    walltime_signal(job_id, user.env)
    st = user.wait(work, name, lambda s: s["state"] in TERMINAL)
    return st, run_dir, node_tmp


def _check_chain(site: str, st: dict[str, Any], run_dir: Path, node_tmp: Path,
                 gpus: bool = True) -> str:
    out, err = _logs(run_dir, "out"), _logs(run_dir, "err")
    assert_complete(st, run_dir)
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"]
    assert "stopped by signal at step 7" in out and out.count("done at step 20") == 2, out
    # nothing of the login node's side, both ranks of both chunks
    assert out.count("leaks: []") == 4, out
    assert "PYTHONSTARTUP ran" not in out + err
    # the site's own step ran: its binds, --nv, --cleanenv, its module line (guarded)
    script = (run_dir / "jobs" / "chain.sbatch").read_text()
    shipped = Registry(environ={}).get(site)
    for bind in shipped.binds:
        assert f"--bind {bind} " in script or f"--bind {bind}\n" in script, bind
    assert ("apptainer exec --nv --cleanenv" if gpus else "apptainer exec --cleanenv") \
        in script
    for line in shipped.modules:
        assert f"if ! command -v apptainer >/dev/null 2>&1; then\n    {line}\nfi" in script
    # --nv on nodes without a driver: said by name, once per task
    assert err.count(NV_NO_DRIVER) == (4 if gpus else 0), err[-4000:]
    # the unpacked images are gone
    assert not list(node_tmp.glob("**/train-apptainer-*")), list(node_tmp.iterdir())
    assert not list(node_tmp.glob("train-job.*")), list(node_tmp.iterdir())
    return out


@pytest.mark.parametrize("site", SITES)
def test_a_sites_step_runs_tasks_in_a_plain_image_and_keeps_the_login_node_out(
        site_user: SiteUser, plain_sif: Path, site_fs: Path, poisoned: dict[str, str],
        site: str) -> None:
    st, run_dir, node_tmp = _chain(site_user, site, plain_sif, "tasks", poisoned)
    out = _check_chain(site, st, run_dir, node_tmp)
    assert out.count("can import train: False torch: False") == 4, out
    _check_gpu_watch(run_dir, st)


def _check_gpu_watch(run_dir: Path, st: dict[str, Any]) -> None:
    """The GPU watch's sampler (the bound copy's, in an image without train) started in
    the container on both nodes of the held chunk, found no NVML and stopped (the chunk
    still went on); no traceback from it."""
    first = (run_dir / "logs" / f"{run_dir.name}-{st['chunks'][0]['job_id']}.err").read_text()
    assert first.count("GPU watch off: NVML cannot start here") == 2, first[-4000:]
    assert "Traceback" not in _logs(run_dir, "err")


@pytest.mark.parametrize("site", SITES)
def test_a_sites_step_runs_torchrun_in_the_ci_image(
        site_user: SiteUser, ci_sif: Path, site_fs: Path, poisoned: dict[str, str],
        site: str) -> None:
    st, run_dir, node_tmp = _chain(site_user, site, ci_sif, "torchrun", poisoned)
    out = _check_chain(site, st, run_dir, node_tmp, gpus=False)
    assert out.count("torch: True") == 4, out  # (the image may hold train itself)


def test_a_bind_the_node_lacks_is_refused_at_submit_and_named_by_doctor(
        site_user: SiteUser, plain_sif: Path) -> None:
    """A profile bind missing on the login node: refused (exit 2, naming binds); the same
    job past the login node's checks (--no-check) fails on the node, and `train doctor`
    names the missing bind."""
    work = site_user.folder("nobind")
    shutil.copy(PLAIN, work / "plain_steps.py")
    (work / "profiles").mkdir()
    (work / "profiles" / "gone.yaml").write_text(json.dumps(
        {"name": "gone", "extends": "local", "binds": ["/lab/gone"]}))
    os.chown(work / "profiles", site_user.uid, site_user.uid)
    env = {"TRAIN_CLUSTERS_PATH": str(work / "profiles")}
    argv = ["submit", "--name", "nb", "--cluster", "gone", "--entry", "command",
            "--cpus-per-task", "1", "--mem", "500M", "--time", "5",
            "--runtime", "apptainer", "--image", str(plain_sif), "--launch", "tasks",
            "--", "python3", str(work / "plain_steps.py")]
    refused = site_user.cli(argv, cwd=work, env=env)
    assert refused.returncode == 2, refused.stderr
    assert "binds" in refused.stderr and "/lab/gone is no folder" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (work / "runs" / "nb" / "chain.ids").exists()
    proc = site_user.cli([*argv[:1], "--no-check", *argv[1:]], cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    st = site_user.wait(work, "nb", lambda s: s["state"] in TERMINAL)
    assert st["state"] != "complete", st
    err = _logs(work / "runs" / "nb", "err")
    assert "mount source /lab/gone doesn't exist" in err, err[-3000:]
    doctor = site_user.cli(["doctor", "nb"], cwd=work)
    assert "a folder bound into the container does not exist on the node" in doctor.stdout, \
        (doctor.stdout, doctor.stderr)
