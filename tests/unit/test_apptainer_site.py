"""What an apptainer job brings into its container, decided in the rendered script and the
task wrapper (client/container.py), run here in bash as the job runs them: the submitting
shell's Apptainer settings dropped, the site's module line only where apptainer is not on
PATH, the user site-packages off, the unpacked image in the task's own folder under the
node's TMPDIR and removed after, --nv without a driver said by name; the profile's binds
checked on the login node; the doctor's rules for both faults at the node."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from train.batch.engine import install
from train.batch.task import NV_NO_DRIVER
from train.client.clusters.profiles import Registry
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import apptainer_setup, render
from train.client.slurm.resolve import resolve
from train.client.slurm.submitcheck import environment_problems

FAKE_APPTAINER = """#!/bin/bash
# records where it would unpack the image, unpacks something there, exits 7
echo "$APPTAINER_TMPDIR" > "$RECORD"
mkdir -p "$APPTAINER_TMPDIR/rootfs-1/usr" && echo x > "$APPTAINER_TMPDIR/rootfs-1/usr/f"
exit 7
"""


def _fake_apptainer(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text(FAKE_APPTAINER)
    fake.chmod(0o755)
    return bin_dir


def _task(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir(exist_ok=True)
    env = {"PATH": f"{_fake_apptainer(tmp_path)}:/usr/bin:/bin", "TMPDIR": str(node_tmp),
           "SLURM_JOB_ID": "42", "RECORD": str(tmp_path / "record")}
    wrapper = [sys.executable, "-E", "-s", install(str(tmp_path)), "task", "--"]
    return subprocess.run([*wrapper, *argv],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


def test_the_task_unpacks_the_image_in_a_folder_of_its_own_and_removes_it(
        tmp_path: Path) -> None:
    proc = _task(tmp_path, "apptainer", "exec", "--cleanenv", "/x.sif", "true")
    assert proc.returncode == 7, proc.stderr  # apptainer's own status
    used = Path((tmp_path / "record").read_text().strip())
    # (in the task's own temporary folder, on the node's)
    assert used.parent.parent == tmp_path / "node-tmp"
    assert used.name.startswith("train-apptainer-42.")
    assert list((tmp_path / "node-tmp").iterdir()) == []  # nothing left on the node


def test_nv_without_a_driver_is_said_by_name(tmp_path: Path) -> None:
    with_nv = _task(tmp_path, "apptainer", "exec", "--nv", "--cleanenv", "/x.sif", "true")
    if os.path.exists("/dev/nvidiactl"):
        assert NV_NO_DRIVER not in with_nv.stderr
    else:
        assert f"train: apptainer --nv on {os.uname().nodename}: {NV_NO_DRIVER}" \
            in with_nv.stderr, with_nv.stderr
    (tmp_path / "bin" / "apptainer").unlink()
    (tmp_path / "bin").rmdir()
    without = _task(tmp_path, "apptainer", "exec", "--cleanenv", "/x.sif", "true")
    assert NV_NO_DRIVER not in without.stderr


def _setup_run(tmp_path: Path, path: str) -> tuple[str, str]:
    """The rendered apptainer set-up of a profile with a module line, run by bash with the
    submitting shell's Apptainer settings set: (env after it, what `module` was asked)."""
    script = "\n".join(["set -euo pipefail",
                        f'module() {{ echo "module $*" >> {tmp_path}/module.log; }}',
                        *apptainer_setup(["module load apptainer"]), "env"])
    env = {"PATH": path, "APPTAINER_BIND": "/etc:/mnt", "APPTAINER_BINDPATH": "/x",
           "APPTAINERENV_PYTHONPATH": "/poison", "SINGULARITYENV_LD_LIBRARY_PATH": "/p",
           "SINGULARITY_BIND": "/y", "KEEP_ME": "1"}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout
    log = tmp_path / "module.log"
    return out, log.read_text() if log.exists() else ""


def test_the_batch_script_drops_the_submitting_shells_apptainer_settings(
        tmp_path: Path) -> None:
    out, _ = _setup_run(tmp_path, "/usr/bin:/bin")
    assert "KEEP_ME=1" in out
    assert not [line for line in out.splitlines()
                if line.startswith(("APPTAINER", "SINGULARITY"))], out


def test_the_site_module_line_runs_only_where_apptainer_is_not_on_path(
        tmp_path: Path) -> None:
    _, asked = _setup_run(tmp_path, f"{_fake_apptainer(tmp_path)}:/usr/bin:/bin")
    assert asked == ""
    _, asked = _setup_run(tmp_path, "/usr/bin:/bin")
    assert asked == "module load apptainer\n"


def _exported(spec: JobSpec) -> dict[str, str]:
    job = resolve(spec, Registry(environ={}).get("local"))
    (line,) = [ln for ln in render(job).splitlines()
               if ln.startswith("export ")]
    out = subprocess.run(["bash", "-c", f"{line}; env -0"], capture_output=True,
                         check=True, env={}).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if item)


SPEC = JobSpec(cluster="local", name="u", out="/tmp/runs/u", cpus_per_task=1, mem="1000M",
               entry="command", launch="tasks", runtime="apptainer", image="/x.sif",
               workload=("python3", "p.py"))


def test_the_user_site_packages_are_off_in_apptainer_unless_the_job_says() -> None:
    env = _exported(SPEC)
    assert env["PYTHONNOUSERSITE"] == "1"
    assert "PYTHONNOUSERSITE" in env["TRAIN_ENV_NAMES"].split()  # handed to the container
    assert "PYTHONNOUSERSITE" not in _exported(dataclasses.replace(SPEC, runtime="none",
                                                                    image=None))
    opted_out = _exported(dataclasses.replace(SPEC, env=("PYTHONNOUSERSITE=",)))
    assert opted_out["PYTHONNOUSERSITE"] == ""  # empty: Python's user site is on again


def test_a_profile_bind_missing_on_the_login_node_is_refused(tmp_path: Path) -> None:
    there = tmp_path / "scratch"
    there.mkdir()
    (tmp_path / "mine.yaml").write_text(
        f"name: mine\nextends: local\nbinds: [{there}, {tmp_path}/depot]\n")
    profile = Registry([tmp_path / "mine.yaml"], environ={}).get("mine")
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"SIF")
    job = resolve(dataclasses.replace(SPEC, cluster="mine", image=str(sif),
                                      workload=("true",)), profile)
    problems, _ = environment_problems(job, {"PATH": "/usr/bin:/bin"})
    binds = [p for p in problems if p.field == "binds"]
    assert len(binds) == 1 and f"{tmp_path}/depot is no folder" in binds[0].text, problems
    assert str(there) not in binds[0].text


def test_an_image_that_became_a_fifo_is_named_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "base.sif"
    os.mkfifo(fifo)
    proc = _task(tmp_path, "apptainer", "exec", "--cleanenv", "--bind", "/a:/b", str(fifo),
                 "true")
    assert proc.returncode == 2 and f"the image {fifo} is not a file or a folder" \
        in proc.stderr, proc.stderr
    assert not (tmp_path / "record").exists()  # apptainer never started
    assert list((tmp_path / "node-tmp").iterdir()) == []
