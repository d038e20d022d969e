"""`train doctor --preflight` (train.client.preflight): each check passes, fails (with its fix) and
skips where it cannot know; bad input is a ConfigError naming the field, never a traceback.

Outside commands are scripted (`Script`) or, where this machine has what a check needs, real:
a writable tmp directory, /proc/self/mounts, a PATH without apptainer, and small scripts in
tmp_path standing in for apptainer, docker and the sites' account commands.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from train.client.clusters.profiles import Registry
from train.client.clusters.schema import Profile
from train.client.clusters.validate import profile_from_dict
from train.client.preflight.account import listed_accounts
from train.client.preflight.gpu import image_cuda
from train.client.preflight.image import ImageFacts, _apptainer_facts, open_image
from train.client.preflight.result import (
    ACCOUNT,
    ARCH,
    CUDA,
    IMAGE,
    RUNS_ROOT,
    RUNTIME,
    Check,
    checks_json,
    failed,
    format_checks,
)
from train.client.preflight.runs_root import (
    TEMP_DIRS,
    Mount,
    _under,
    _unescape,
    mount_of,
    read_mounts,
)
from train.client.preflight.suite import run_preflight
from train.common import _proc
from train.common._proc import ProcError
from train.common.errors import ConfigError

SHIPPED = Registry(environ={})
NODE = {"gpus_per_node": 4, "gpu_types": ["a100"], "cpus_per_node": 32,
        "mem_per_node": "100G", "max_time": "1-00:00:00"}
SIF_HEAD = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC\0" + b"01 "
LABELS = {"org.train.image": "base", "org.train.lock": "base-cu130.txt",
          "org.train.base-image": "nvidia/cuda:13.0.0-runtime-ubuntu24.04"}
INSPECT = json.dumps({"data": {"attributes": {"labels": LABELS, "environment": {
    "/.singularity.d/env/10-docker2singularity.sh": 'export CUDA_VERSION="13.0.0"'}}},
    "type": "container"})


def site(**extra: Any) -> Profile:
    """A site like Gilbreth: account required and listed by `myaccounts`, partitions whose
    drivers are recorded (old: 550, new: 580), apptainer from a module."""
    data: dict[str, Any] = {
        "name": "site",
        "account": {"required": True, "hint": "list your accounts with: myaccounts",
                    "list_command": ["myaccounts"]},
        "partition": {"required": True, "allowed": True},
        "modules": ["module load apptainer"],
        "scratch_root": "/scratch/site",
        "partitions": {"old": {**NODE, "driver_version": "550.54.15"},
                       "new": {**NODE, "driver_version": "580.65.06"},
                       "plain": dict(NODE)},
    }
    data.update(extra)
    return profile_from_dict(data, "test")


class Script:
    """A scripted `run`: answers by the program's name and first argument ("apptainer
    inspect"), else by the name alone. An answer is stdout, (code, stdout, stderr) or an
    exception; a command without an answer fails the test."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float = 60.0,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        assert timeout > 0
        self.calls.append(list(argv))
        name = Path(argv[0]).name
        key = f"{name} {argv[1]}" if len(argv) > 1 and f"{name} {argv[1]}" in self.answers \
            else name
        assert key in self.answers, f"unexpected command {argv}"
        answer = self.answers[key]
        if isinstance(answer, Exception):
            raise answer
        code, out, err = answer if isinstance(answer, tuple) else (0, answer, "")
        return subprocess.CompletedProcess(list(argv), code, out, err)


def tool(bin_dir: Path, name: str, body: str = "exit 0") -> Path:
    """An executable script named `name` in bin_dir (on the PATH tests give)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def mounts(tmp_path: Path, *entries: tuple[str, str]) -> Path:
    """A mount table (point, fstype), in /proc/self/mounts' format."""
    path = tmp_path / "mounts"
    path.write_text("".join(f"dev{i} {point.replace(' ', chr(92) + '040')} {fs} rw 0 0\n"
                            for i, (point, fs) in enumerate(entries)))
    return path


def sif(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(SIF_HEAD + b"\0" * 128)
    return path


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def preflight_of(profile: Profile, tmp_path: Path, *, image: str | Path | None = None,
                 account: str | None = None, runs_root: Path | None = None,
                 partition: str | None = None, runtime: str = "auto",
                 path: Sequence[Path] = (), answers: dict[str, Any] | None = None,
                 table: Path | None = None) -> dict[str, Check]:
    """run_preflight with a PATH of `path` only, a scripted run (when `answers`) and a mount
    table that puts tmp_path on NFS (unless `table`)."""
    environ = {"PATH": os.pathsep.join(str(p) for p in path) or str(tmp_path / "empty"),
               "USER": "alice"}
    kwargs: dict[str, Any] = {}
    if answers is not None:
        kwargs["run"] = Script(answers)
    checks = run_preflight(
        profile, image=image, account=account,
        runs_root=runs_root if runs_root is not None else tmp_path / "runs",
        partition_or_constraint=partition, runtime=runtime, environ=environ,
        mounts=table if table is not None else mounts(tmp_path, ("/", "ext4"),
                                                      (str(tmp_path), "nfs4")),
        **kwargs)
    assert [c.name for c in checks] == [RUNTIME, IMAGE, ACCOUNT, RUNS_ROOT, CUDA, ARCH]
    return by_name(checks)


# -- 1. container runtime --------------------------------------------------------------------
def test_runtime_passes_with_a_recent_apptainer(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    got = preflight_of(site(), tmp_path, account="lab", partition="new", path=[bin_dir],
                       answers={"apptainer --version": "apptainer version 1.3.4\n",
                                "myaccounts": "lab\n"})[RUNTIME]
    assert got.status == "pass"
    assert "apptainer 1.3.4" in got.detail and "module load apptainer" in got.detail


def test_runtime_warns_for_apptainer_older_than_the_images_need(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    got = preflight_of(site(), tmp_path, account="lab", partition="new", path=[bin_dir],
                       answers={"apptainer --version": "apptainer version 1.1.9\n",
                                "myaccounts": "lab"})[RUNTIME]
    assert got.ok is True and got.warn and got.status == "warn"
    assert "1.2.0" in got.detail and "build the images elsewhere" in got.fix


def test_runtime_fails_when_version_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    got = preflight_of(site(), tmp_path, account="lab", partition="new", path=[bin_dir],
                       answers={"apptainer --version": (1, "", "FATAL: broken install"),
                                "myaccounts": "lab"})[RUNTIME]
    assert got.ok is False and "broken install" in got.detail and got.fix


def test_runtime_missing_fails_with_the_profiles_module_line(tmp_path: Path) -> None:
    checks = preflight_of(site(), tmp_path, account="lab", partition="new",
                          answers={})  # nothing on PATH: no command may run
    got = checks[RUNTIME]
    assert got.ok is False and "not on PATH" in got.detail
    assert "module load apptainer" in got.fix
    assert checks[IMAGE].ok is None  # no image given


def test_runtime_missing_on_this_machines_real_path(tmp_path: Path) -> None:
    if shutil.which("apptainer"):
        pytest.skip("apptainer is installed here")
    checks = run_preflight(SHIPPED.get("gilbreth"), image=None, account=None,
                           runs_root=tmp_path, partition_or_constraint="a30",
                           runtime="apptainer")
    got = by_name(checks)[RUNTIME]
    assert got.ok is False and "apptainer is not on PATH" in got.detail
    assert "module load apptainer" in got.fix


def test_runtime_real_fake_apptainer_prints_its_version(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer", 'echo "apptainer version 1.4.2"')
    got = preflight_of(SHIPPED.get("torch"), tmp_path, path=[bin_dir],
                       runtime="apptainer")[RUNTIME]
    assert got.status == "pass" and "apptainer 1.4.2" in got.detail


def test_runtime_singularity_alone_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "singularity", 'echo "singularity-ce version 4.1.0"')
    got = preflight_of(SHIPPED.get("torch"), tmp_path, path=[bin_dir])[RUNTIME]
    assert got.ok is False and "only singularity" in got.detail
    assert "singularity-ce version 4.1.0" in got.detail and got.fix


@pytest.mark.parametrize("said", ["singularity-ce version 3.11.4",
                                  "SingularityCE version 4.1.0-jammy",
                                  "singularity version 3.8.7-1.el8"])
def test_runtime_singularityce_named_apptainer_fails(tmp_path: Path, said: str) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer", f'echo "{said}"')
    got = preflight_of(site(), tmp_path, account="lab", partition="new", path=[bin_dir],
                       runtime="apptainer", answers={"apptainer --version": said + "\n",
                                                     "myaccounts": "lab\n"})[RUNTIME]
    assert got.ok is False and "not Apptainer" in got.detail and said in got.detail
    assert "apptainer exec" in got.detail and "module load apptainer" in got.fix
    # the real command too (no scripted run), and without a module line
    got = preflight_of(SHIPPED.get("torch"), tmp_path, path=[bin_dir],
                       runtime="apptainer")[RUNTIME]
    assert got.ok is False and "not Apptainer" in got.detail and "Apptainer" in got.fix


def test_runtime_docker_on_the_local_cluster(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "docker", 'echo "Docker version 20.10.24"')
    got = preflight_of(SHIPPED.get("local"), tmp_path, path=[bin_dir])[RUNTIME]
    assert got.status == "pass" and "docker (auto)" in got.detail
    assert "no apptainer" in got.detail


def test_runtime_docker_missing_fails(tmp_path: Path) -> None:
    got = preflight_of(SHIPPED.get("local"), tmp_path, runtime="docker")[RUNTIME]
    assert got.ok is False and "docker" in got.detail and "ci/docker-up.sh" in got.fix


def test_runtime_none_skips_the_container_checks(tmp_path: Path) -> None:
    checks = preflight_of(site(), tmp_path, account="lab", partition="old",
                          runtime="none", answers={})
    assert checks[RUNTIME].ok is None and checks[IMAGE].ok is None
    assert checks[CUDA].ok is None


# -- 2. the image ----------------------------------------------------------------------------
def test_image_opens_with_apptainer_inspect(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    image = sif(tmp_path / "images" / "base.sif")
    script = {"apptainer --version": "apptainer version 1.3.4", "apptainer inspect": INSPECT,
              "myaccounts": "lab"}
    got = preflight_of(site(), tmp_path, image=image, account="lab", partition="new",
                       path=[bin_dir], answers=script)[IMAGE]
    assert got.status == "pass", got
    assert "org.train.lock=base-cu130.txt" in got.detail


PROBE_311 = ('TRAIN-PROBE {"python": [3, 11, 2], "torch": false, "train": false, '
             '"pynvml": false, "nvidia_smi": false}\n')


def _foreign(tmp_path: Path, probe: Any, python: str = "python3") -> tuple[Check, Script]:
    """The image check of a SIF whose labels are not ours, its Python answering `probe`."""
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    image = sif(tmp_path / "images" / "plain.sif")
    script = Script({"apptainer --version": "apptainer version 1.4.5",
                     "apptainer inspect": '{"data": {"attributes": {"labels": {}}}}',
                     "apptainer exec": probe})
    checks = run_preflight(site(), image=image, account=None, runs_root=tmp_path / "runs",
                           partition_or_constraint="new", runtime="apptainer",
                           environ={"PATH": str(bin_dir)}, run=script, python=python,
                           mounts=mounts(tmp_path, ("/", "ext4"), (str(tmp_path), "nfs4")))
    return by_name(checks)[IMAGE], script


def test_image_not_ours_says_what_its_python_holds(tmp_path: Path) -> None:
    got, script = _foreign(tmp_path, PROBE_311, python="/usr/bin/python3")
    assert got.status == "pass", got
    assert "not one of our images: its Python (/usr/bin/python3) is 3.11.2: train no, " \
        "torch no, pynvml no (jobs bind this client's launcher in)" in got.detail
    probe = [c for c in script.calls if c[1] == "exec"]
    assert probe and probe[0][2:5] == ["--cleanenv", str(tmp_path / "images" / "plain.sif"),
                                       "/usr/bin/python3"]


def test_image_without_its_python_fails_naming_it(tmp_path: Path) -> None:
    said = 'FATAL:   "python3": executable file not found in $PATH'
    got, _ = _foreign(tmp_path, (255, "", said))
    assert got.ok is False, got
    assert "its Python (python3) does not run in it (exit 255: " in got.detail
    assert "executable file not found" in got.detail and "--python" in got.fix


def test_image_with_a_python_too_old_for_the_launcher_fails(tmp_path: Path) -> None:
    got, _ = _foreign(tmp_path, 'TRAIN-PROBE {"python": [2, 7, 18]}\n')
    assert got.ok is False and "is 2.7.18" in got.detail and ">= 3.9" in got.detail


def test_image_of_ours_is_not_probed(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    script = Script({"apptainer --version": "apptainer version 1.4.5",
                     "apptainer inspect": INSPECT})
    checks = run_preflight(site(), image=sif(tmp_path / "base.sif"), account=None,
                           runs_root=tmp_path / "runs", partition_or_constraint="new",
                           runtime="apptainer", environ={"PATH": str(bin_dir)}, run=script,
                           mounts=mounts(tmp_path, ("/", "ext4"), (str(tmp_path), "nfs4")))
    assert by_name(checks)[IMAGE].status == "pass"
    assert not [c for c in script.calls if c[1] == "exec"]


def test_image_on_a_local_file_system_warns(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    image = sif(tmp_path / "base.sif")
    got = preflight_of(site(), tmp_path, image=image, account="lab", partition="new",
                       path=[bin_dir], table=mounts(tmp_path, ("/", "ext4"),
                                                    (str(tmp_path), "tmpfs")),
                       answers={"apptainer --version": "apptainer version 1.3.4",
                                "apptainer inspect": INSPECT, "myaccounts": "lab"})[IMAGE]
    assert got.ok is True and got.warn and "tmpfs" in got.detail
    assert "/scratch/site" in got.fix


def test_image_real_fake_apptainer_inspects(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    (tmp_path / "inspect.json").write_text(INSPECT)
    tool(bin_dir, "apptainer", 'if [ "$1" = --version ]; then echo "apptainer version 1.3.4"; '
         f'elif [ "$1" = inspect ]; then cat {tmp_path / "inspect.json"}; else exit 2; fi')
    image = sif(tmp_path / "base.sif")
    checks = preflight_of(site(), tmp_path, image=image, account="lab", partition="new",
                          path=[bin_dir])
    assert checks[IMAGE].status == "pass", checks[IMAGE]
    assert checks[CUDA].ok is True  # CUDA 13.0 from the lock, driver 580 on "new"


def test_image_that_apptainer_cannot_open_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    image = sif(tmp_path / "base.sif")
    got = preflight_of(site(), tmp_path, image=image, account="lab", partition="new",
                       path=[bin_dir], answers={
                           "apptainer --version": "apptainer version 1.3.4",
                           "apptainer inspect": (255, "", "FATAL: could not open image: "
                                                 "truncated"),
                           "myaccounts": "lab"})[IMAGE]
    assert got.ok is False and "truncated" in got.detail and "copy" in got.fix


def test_image_inspect_timing_out_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    image = sif(tmp_path / "base.sif")
    timeout = ProcError(["apptainer", "inspect"], 124, "timed out after 120 s")
    got = preflight_of(site(), tmp_path, image=image, account="lab", partition="new",
                       path=[bin_dir], answers={
                           "apptainer --version": "apptainer version 1.3.4",
                           "apptainer inspect": timeout, "myaccounts": "lab"})[IMAGE]
    assert got.ok is False and "timed out" in got.detail


def test_image_missing_fails(tmp_path: Path) -> None:
    got = preflight_of(site(), tmp_path, image=tmp_path / "nope.sif", account="lab",
                       partition="new", answers={})[IMAGE]
    assert got.ok is False and "does not exist" in got.detail
    assert "train image build" in got.fix


def test_image_that_is_a_directory_fails(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    got = preflight_of(site(), tmp_path, image=folder, account="lab", partition="new",
                       answers={})[IMAGE]
    assert got.ok is False and "is a directory" in got.detail and ".sif" in got.fix


def test_image_sandbox_directory_is_inspected(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    sandbox = tmp_path / "base"
    (sandbox / ".singularity.d").mkdir(parents=True)
    got = preflight_of(site(), tmp_path, image=sandbox, account="lab", partition="new",
                       path=[bin_dir], answers={
                           "apptainer --version": "apptainer version 1.3.4",
                           "apptainer inspect": INSPECT, "myaccounts": "lab"})[IMAGE]
    assert got.status == "pass"


def test_image_that_is_not_a_sif_fails(tmp_path: Path) -> None:
    bad = tmp_path / "base.sif"
    bad.write_text("<html>404 not found</html>")
    got = preflight_of(site(), tmp_path, image=bad, account="lab", partition="new",
                       answers={})[IMAGE]
    assert got.ok is False and "not a SIF image" in got.detail and got.fix


def test_image_without_apptainer_is_checked_as_a_file_and_skipped(tmp_path: Path) -> None:
    image = sif(tmp_path / "base.sif")
    got = preflight_of(site(), tmp_path, image=image, account="lab", partition="new",
                       answers={})[IMAGE]
    assert got.ok is None and "readable" in got.detail and "not opened" in got.detail


def test_image_not_readable_fails(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    image = sif(tmp_path / "base.sif")
    image.chmod(0)
    got = preflight_of(site(), tmp_path, image=image, account="lab", partition="new",
                       answers={})[IMAGE]
    assert got.ok is False and "not readable" in got.detail and "chmod" in got.fix


def test_docker_image_is_inspected(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "docker")
    answer = json.dumps([{"Id": "sha256:abc", "Config": {
        "Labels": {"org.train.image": "base", "org.train.lock": "base-cpu.txt"},
        "Env": ["PATH=/opt/venv/bin"]}}])
    got = preflight_of(SHIPPED.get("local"), tmp_path, image="train-base:ci", path=[bin_dir],
                       answers={"docker --version": "Docker version 20.10.24",
                                "docker image": answer})[IMAGE]
    assert got.status == "pass" and "org.train.lock=base-cpu.txt" in got.detail


def test_docker_image_without_engine_or_image_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "docker")
    down = (1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
            "Is the docker daemon running?")
    got = preflight_of(SHIPPED.get("local"), tmp_path, image="train-base:ci", path=[bin_dir],
                       answers={"docker --version": "Docker version 20.10.24",
                                "docker image": down})[IMAGE]
    assert got.ok is False and "ci/docker-up.sh" in got.fix
    missing = (1, "[]", "Error: No such image: train-base:ci")
    got = preflight_of(SHIPPED.get("local"), tmp_path, image="train-base:ci", path=[bin_dir],
                       answers={"docker --version": "Docker version 20.10.24",
                                "docker image": missing})[IMAGE]
    assert got.ok is False and "No such image" in got.detail and "train image build" in got.fix


# -- 3. account ------------------------------------------------------------------------------
def test_account_required_but_missing_fails_with_the_hint(tmp_path: Path) -> None:
    got = preflight_of(site(), tmp_path, partition="new", answers={})[ACCOUNT]
    assert got.ok is False and "myaccounts" in got.detail and "--account" in got.fix


def test_account_not_required_and_missing_skips(tmp_path: Path) -> None:
    got = preflight_of(SHIPPED.get("local"), tmp_path, runtime="none")[ACCOUNT]
    assert got.ok is None and "does not require" in got.detail


def test_account_listed_by_the_sites_command(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "myaccounts")
    table = "Account   Total  Queue\n=======   =====  =====\nOtherLab  8 0\nLab  4 0\n"
    got = preflight_of(site(), tmp_path, account="lab", partition="new", path=[bin_dir],
                       answers={"myaccounts": table})[ACCOUNT]
    assert got.status == "pass" and "`myaccounts`" in got.detail


def test_account_real_site_command_on_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "my_slurm_accounts", 'echo "torch_pr_123_general"; echo "torch_pr_9_tandon"')
    torch = SHIPPED.get("torch")
    checks = preflight_of(torch, tmp_path, account="torch_pr_9_tandon", runtime="none",
                          path=[bin_dir])
    assert checks[ACCOUNT].status == "pass"
    checks = preflight_of(torch, tmp_path, account="torch_pr_5_other", runtime="none",
                          path=[bin_dir])
    got = checks[ACCOUNT]
    assert got.ok is False and "does not list torch_pr_5_other" in got.detail
    assert "my_slurm_accounts" in got.fix


SLIST = """\
                      Current Number of GPUs                        Node
Account             Total    Queue     Run    Free    Max Walltime    Type
==============  =================================  ==============  ======
debug                   8        0       0       8        00:30:00     B,F,G
standby               512       64      12     500        04:00:00     B,F,G
torch_pr_123           16        0       4      12     14-00:00:00     K
"""
ALLOCATIONS = """\
Account                      Balance        Reserved       Available
-----------------            ---------      ---------      ---------
hpc_build                    9999986        0              9999986
lab_gpu_x                    1200           0              1200

for more information about a specific allocation, run: allocations -a <allocation name>
"""
BOXED = "| Account | Balance |\n|---------|---------|\n| lab_boxed | 10 |\n"


@pytest.mark.parametrize(("output", "account", "listed"), [
    (SLIST, "torch_pr_123", True), (SLIST, "standby", True), (SLIST, "debug", True),
    (SLIST, "16", False), (SLIST, "k", False), (SLIST, "walltime", False),
    (ALLOCATIONS, "hpc_build", True), (ALLOCATIONS, "LAB_GPU_X", True),
    (ALLOCATIONS, "allocation", False), (ALLOCATIONS, "specific", False),
    (ALLOCATIONS, "9999986", False), (BOXED, "lab_boxed", True), (BOXED, "10", False),
    ("torch_pr_123\ntorch_pr_9_tandon\n", "torch_pr_9_tandon", True),
    ("lab|\nother|\n", "other", True),  # sacctmgr -nP with a field after it
    # hostile: a word of the output that is not the first field of its line
    ("torch_pr_000 torch_pr_001 torch_pr_002 some other text\n", "some", False),
    ("torch_pr_000 torch_pr_001 torch_pr_002 some other text\n", "torch_pr_001", False),
    ("you are not in torch_pr_123-old, denied: torch_pr_123 is suspended\n",
     "torch_pr_123", False),
    ("Error: account torch_pr_123 does not exist\n", "torch_pr_123", False),
])
def test_account_must_lead_a_line_of_the_sites_output(output: str, account: str,
                                                      listed: bool) -> None:
    assert (account.lower() in listed_accounts(output)) is listed


def test_account_named_mid_line_by_the_site_is_not_listed(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "my_slurm_accounts",
         'echo "you are not in torch_pr_123-old, denied: torch_pr_123 is suspended"')
    torch = SHIPPED.get("torch")
    got = preflight_of(torch, tmp_path, account="torch_pr_123", runtime="none",
                       path=[bin_dir])[ACCOUNT]
    assert got.ok is False and "does not list torch_pr_123" in got.detail
    tool(bin_dir, "my_slurm_accounts", 'echo "torch_pr_0 torch_pr_1 some other text"')
    got = preflight_of(torch, tmp_path, account="some", runtime="none",
                       path=[bin_dir])[ACCOUNT]
    assert got.ok is False
    got = preflight_of(site(), tmp_path, account="torch_pr_123", partition="new",
                       path=[tool(tmp_path / "b2", "myaccounts").parent],
                       answers={"myaccounts": SLIST})[ACCOUNT]
    assert got.status == "pass"


def test_account_from_sacctmgr_when_the_site_command_is_missing(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "sacctmgr")
    checks = preflight_of(site(), tmp_path, account="lab", partition="new", path=[bin_dir],
                          answers={"sacctmgr": "lab\nlab\nother\n"})
    assert checks[ACCOUNT].status == "pass" and "sacctmgr" in checks[ACCOUNT].detail
    got = preflight_of(site(), tmp_path, account="nope", partition="new", path=[bin_dir],
                       answers={"sacctmgr": "lab\nother\n"})[ACCOUNT]
    assert got.ok is False and "lab, other" in got.detail and "--account" in got.fix


def test_account_sacctmgr_overrules_a_site_listing_that_misses_it(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "myaccounts")
    tool(bin_dir, "sacctmgr")
    got = preflight_of(site(), tmp_path, account="lab", partition="new", path=[bin_dir],
                       answers={"myaccounts": "Account\n-------\nla...\n",
                                "sacctmgr": "lab\n"})[ACCOUNT]
    assert got.status == "pass"


def test_account_unknowable_skips_never_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "myaccounts")
    tool(bin_dir, "sacctmgr")
    got = preflight_of(site(), tmp_path, account="lab", partition="new", path=[bin_dir],
                       answers={"myaccounts": (1, "", "database unavailable"),
                                "sacctmgr": (1, "", "sacctmgr: fatal: Could not establish a "
                                             "configuration source")})[ACCOUNT]
    assert got.ok is None and "database unavailable" in got.detail
    assert "Could not establish" in got.detail
    got = preflight_of(site(), tmp_path, account="lab", partition="new", answers={})[ACCOUNT]
    assert got.ok is None and "not on PATH" in got.detail


# -- 4. runs root ----------------------------------------------------------------------------
def test_runs_root_real_tmp_dir_and_real_mount_table(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    checks = run_preflight(SHIPPED.get("gilbreth"), image=None, account=None, runs_root=root,
                           partition_or_constraint="a30", runtime="none",
                           environ={"PATH": str(tmp_path / "empty")})
    got = by_name(checks)[RUNS_ROOT]
    assert got.ok is not None and str(root) in got.detail
    if got.ok:
        assert "writable" in got.detail
    assert list(root.iterdir()) == []  # the test file is gone


def test_runs_root_on_nfs_passes_and_notes_scratch(tmp_path: Path) -> None:
    profile = site(scratch_root=str(tmp_path))
    got = preflight_of(profile, tmp_path, runtime="none", account="lab", partition="new",
                       path=[])[RUNS_ROOT]
    assert got.status == "pass" and "does not exist yet" in got.detail
    assert "nfs4" in got.detail and "under the site's scratch" in got.detail


def test_runs_root_on_tmpfs_fails_with_the_fix(tmp_path: Path) -> None:
    table = mounts(tmp_path, ("/", "ext4"), (str(tmp_path), "tmpfs"))
    got = preflight_of(site(), tmp_path, runtime="none", account="lab", partition="new",
                       table=table)[RUNS_ROOT]
    assert got.ok is False and "tmpfs" in got.detail and "/scratch/site/$USER" in got.fix


def test_runs_root_under_tmp_on_a_local_disk_fails(tmp_path: Path) -> None:
    if os.path.realpath("/tmp") != "/tmp" or not os.access("/tmp", os.W_OK):
        pytest.skip("/tmp is not a plain writable directory here")
    root = Path("/tmp") / f"train-preflight-test-{os.getpid()}" / "runs"  # never created
    table = mounts(tmp_path, ("/", "ext4"))
    got = preflight_of(site(), tmp_path, runtime="none", account="lab", partition="new",
                       runs_root=root, table=table)[RUNS_ROOT]
    assert got.ok is False and "under /tmp" in got.detail
    assert not root.parent.exists()


def test_runs_root_on_a_local_disk_elsewhere_warns(tmp_path: Path) -> None:
    table = mounts(tmp_path, ("/", "nfs"), (str(tmp_path), "xfs"))
    got = preflight_of(site(), tmp_path, runtime="none", account="lab", partition="new",
                       table=table)[RUNS_ROOT]
    if any(_under(os.path.realpath(tmp_path), t) for t in TEMP_DIRS):
        assert got.ok is False  # tmp_path itself lies under /tmp: node-local scratch
    else:
        assert got.ok is True and got.warn and "local disk" in got.detail


def test_runs_root_unreadable_mount_table_warns(tmp_path: Path) -> None:
    got = preflight_of(site(), tmp_path, runtime="none", account="lab", partition="new",
                       table=tmp_path / "no-such-mounts")[RUNS_ROOT]
    assert got.ok is True and got.warn and "mount table" in got.detail


def test_runs_root_single_host_profile_passes(tmp_path: Path) -> None:
    table = mounts(tmp_path, ("/", "ext4"), (str(tmp_path), "tmpfs"))
    got = preflight_of(SHIPPED.get("local"), tmp_path, runtime="none", table=table)[RUNS_ROOT]
    assert got.status == "pass" and "this machine" in got.detail


def test_runs_root_that_is_a_file_fails(tmp_path: Path) -> None:
    file = tmp_path / "runs"
    file.write_text("not a directory")
    got = preflight_of(site(), tmp_path, runtime="none", account="lab", partition="new",
                       runs_root=file)[RUNS_ROOT]
    assert got.ok is False and "is a file" in got.detail and got.fix
    got = preflight_of(site(), tmp_path, runtime="none", account="lab", partition="new",
                       runs_root=file / "deeper")[RUNS_ROOT]
    assert got.ok is False and "cannot be created" in got.detail


def test_runs_root_that_is_a_dangling_symlink_fails(tmp_path: Path) -> None:
    dangling = tmp_path / "dang"
    dangling.symlink_to("/nonexistent/zzz")
    for root in (dangling, dangling / "runs"):
        got = preflight_of(site(), tmp_path, runtime="none", account="lab",
                           partition="new", runs_root=root)[RUNS_ROOT]
        assert got.ok is False, got
        assert "symbolic link" in got.detail and "/nonexistent/zzz" in got.detail
        assert str(dangling) in got.fix and "mkdir -p /nonexistent/zzz" in got.fix
    # the way it would fail: mkdir cannot make it
    with pytest.raises(FileExistsError):
        dangling.mkdir(parents=True, exist_ok=True)


def test_runs_root_under_a_symlink_loop_fails(tmp_path: Path) -> None:
    (tmp_path / "loopA").symlink_to("loopB")
    (tmp_path / "loopB").symlink_to("loopA")
    for root in (tmp_path / "loopA", tmp_path / "loopA" / "runs" / "deeper"):
        got = preflight_of(site(), tmp_path, runtime="none", account="lab",
                           partition="new", runs_root=root)[RUNS_ROOT]
        assert got.ok is False, got
        assert "loop of symbolic links" in got.detail and "loopA" in got.detail
        assert "--runs" in got.fix


def test_runs_root_through_a_good_symlink_still_passes(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    got = preflight_of(site(), tmp_path, runtime="none", account="lab", partition="new",
                       runs_root=tmp_path / "link" / "runs")[RUNS_ROOT]
    assert got.ok is True and "does not exist yet" in got.detail


def test_runs_root_not_writable_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(directory: Path, field: str) -> None:
        raise ConfigError(field, f"cannot write to {directory}: Permission denied")

    monkeypatch.setattr("train.client.preflight.runs_root.check_writable_dir", refuse)
    got = preflight_of(site(), tmp_path, runtime="none", account="lab", partition="new")
    assert got[RUNS_ROOT].ok is False and "Permission denied" in got[RUNS_ROOT].detail
    assert "chmod" in got[RUNS_ROOT].fix


# -- the runner ------------------------------------------------------------------------------
def _gone(pid: int) -> bool:
    from train.node.gpuwatch import process_alive

    deadline = time.monotonic() + 60  # hang guard only
    while process_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_hung_command_and_its_children_are_killed_on_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    child = tmp_path / "child.pid"
    # a wrapper script whose child hangs (the script waits for it)
    tool(bin_dir, "apptainer", f'sleep 3600 &\necho $! > {child}\nwait')
    # the real 30 s, shortened
    monkeypatch.setattr("train.client.preflight.container._VERSION_TIMEOUT", 2.0)
    got = preflight_of(SHIPPED.get("torch"), tmp_path, path=[bin_dir],
                       runtime="apptainer")[RUNTIME]
    assert got.ok is False and "exit 124" in got.detail and "timed out" in got.detail
    pid = int(child.read_text())
    try:
        assert _gone(pid), "the hung command's child was left running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def test_the_runner_reports_like_proc_run(tmp_path: Path) -> None:
    got = _proc.run(["sh", "-c", "printf 'a\\377\\376b'; printf 'e\\377' >&2"],
                    check=False)
    assert got.returncode == 0 and got.stdout == "a\ufffd\ufffdb" and got.stderr == "e\ufffd"
    with pytest.raises(ProcError) as err:
        _proc.run(["sh", "-c", "echo bad >&2; exit 3"])
    assert err.value.returncode == 3 and "bad" in err.value.stderr
    with pytest.raises(ProcError) as err:
        _proc.run([str(tmp_path / "no-such-program")])
    assert err.value.returncode == 127
    with pytest.raises(ProcError) as err:
        _proc.run(["sleep", "3600"], timeout=0.5)
    assert err.value.returncode == 124


def test_non_utf8_output_of_the_real_commands_is_read(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer", "printf 'apptainer version 1.3.4 \\377\\376\\n'")
    got = preflight_of(SHIPPED.get("torch"), tmp_path, path=[bin_dir],
                       runtime="apptainer")[RUNTIME]
    assert got.status == "pass" and "apptainer 1.3.4" in got.detail


def test_mount_table_parsing() -> None:
    table = [Mount("/", "ext4"), Mount("/scratch", "lustre"),
             Mount("/scratch/x y", "nfs4"), Mount("/scratchy", "xfs")]
    assert mount_of("/scratch/u/runs", table) == table[1]
    assert mount_of("/scratch/x y/runs", table) == table[2]
    assert mount_of("/scratchy/runs", table) == table[3]
    assert mount_of("/home/u", table) == table[0]
    assert _unescape("/scratch/x\\040y") == "/scratch/x y"


def test_real_mount_table_reads() -> None:
    table = read_mounts()
    if not table:
        pytest.skip("no /proc/self/mounts here")
    assert mount_of("/", table) is not None


# -- 5. CUDA build vs driver -----------------------------------------------------------------
def _opened(tmp_path: Path, profile: Profile, partition: str | None,
            labels: dict[str, str], check: str = CUDA) -> Check:
    """The check named `check` of an image that opens with these labels."""
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "apptainer")
    image = sif(tmp_path / "img.sif")
    inspect = json.dumps({"data": {"attributes": {"labels": labels}}, "type": "container"})
    return preflight_of(profile, tmp_path, image=image, account="lab", partition=partition,
                        path=[bin_dir], answers={
                            "apptainer --version": "apptainer version 1.3.4",
                            "apptainer inspect": inspect, "apptainer exec": PROBE_311,
                            "myaccounts": "lab"})[check]


def test_cuda_13_image_on_an_old_driver_fails_with_the_fix(tmp_path: Path) -> None:
    got = _opened(tmp_path, site(), "old", LABELS)
    assert got.ok is False and ">= 580" in got.detail and "550.54.15" in got.detail
    assert "new (--partition)" in got.fix and "CUDA 12.x" in got.fix
    assert "BASE_IMAGE" in got.fix and "BASE_LOCK=base-cu128.txt" in got.fix  # shipped


def test_cuda_13_image_on_a_new_driver_passes(tmp_path: Path) -> None:
    got = _opened(tmp_path, site(), "new", LABELS)
    assert got.status == "pass" and "580.65.06" in got.detail


def test_cuda_not_recorded_skips(tmp_path: Path) -> None:
    got = _opened(tmp_path, site(), "plain", LABELS)
    assert got.ok is None and "driver_version" in got.detail


def test_cuda_cpu_image_on_gpu_nodes_fails(tmp_path: Path) -> None:
    got = _opened(tmp_path, site(), "new", {"org.train.lock": "base-cpu.txt"})
    assert got.ok is False and "CPU build" in got.detail and "base-cu130" in got.fix


def test_cuda_unknown_image_skips(tmp_path: Path) -> None:
    got = _opened(tmp_path, site(), "new", {"org.train.image": "mine"})
    assert got.ok is None and "no CUDA version" in got.detail


def test_cuda_without_partition_warns_about_the_old_ones(tmp_path: Path) -> None:
    got = _opened(tmp_path, site(), None, LABELS)  # no default partition: every node type
    assert got.ok is True and got.warn and "avoid old" in got.detail


def test_cuda_constraint_alternatives_must_all_suit(tmp_path: Path) -> None:
    node = {**NODE, "gpu_types": ["h200"]}
    profile = profile_from_dict({
        "name": "constrained", "partition": {"allowed": False},
        "constraints": {"h200": {**node, "driver_version": 580},
                        "l40s": {**node, "driver_version": "535.104.05"}}}, "test")
    got = _opened(tmp_path, profile, "h200|l40s", LABELS)
    assert got.ok is False and "l40s" in got.detail and "h200 (--constraint)" in got.fix
    assert _opened(tmp_path, profile, "h200", LABELS).status == "pass"


def _arch(tmp_path: Path, profile: Profile, partition: str | None,
          labels: dict[str, str]) -> Check:
    return _opened(tmp_path, profile, partition, labels, ARCH)


def test_arch_the_cuda13_image_on_gilbreths_v100_partition_fails_with_the_variant(
        tmp_path: Path) -> None:
    """The shipped lock's header (read from its torch wheel) has no sm_70: a V100 job is
    refused on the login node, not after the queue wait."""
    got = _arch(tmp_path, SHIPPED.get("gilbreth"), "v100", LABELS)
    assert got.ok is False and "v100 (sm_70)" in got.detail and "sm_75" in got.detail
    assert "base-cu128.txt" in got.fix
    cu128 = {**LABELS, "org.train.lock": "base-cu128.txt"}
    assert _arch(tmp_path, SHIPPED.get("gilbreth"), "v100", cu128).status == "pass"
    assert _arch(tmp_path, SHIPPED.get("gilbreth"), "a30", LABELS).status == "pass"


def test_arch_mixed_partition_warns_and_unknown_images_skip(tmp_path: Path) -> None:
    got = _arch(tmp_path, SHIPPED.get("gilbreth"), "training", LABELS)  # V100, A100, H100
    assert got.ok is False and "v100" in got.detail and "a100" not in got.detail.split(
        "no code for")[1]
    label = {"org.train.arch": "sm_70 sm_80", "org.train.image": "mine"}
    assert _arch(tmp_path, SHIPPED.get("gilbreth"), "training", label).ok is False
    assert _arch(tmp_path, SHIPPED.get("gilbreth"), "v100", label).status == "pass"
    assert _arch(tmp_path, SHIPPED.get("gilbreth"), "v100", {"x": "y"}).ok is None


def test_arch_rivannas_rtx2080_trains_on_cuda13_but_its_linalg_is_named(tmp_path: Path
                                                                       ) -> None:
    """torch 2.13.0's linear algebra library has no sm_75 (its main library has): a warning
    naming the GPU and the variant, not a failure."""
    got = _arch(tmp_path, SHIPPED.get("rivanna"), "interactive", LABELS)
    assert got.ok is True and got.warn and "rtx2080 (sm_75)" in got.detail
    assert "torch.linalg" in got.detail and "base-cu128.txt" in got.fix
    cu128 = {**LABELS, "org.train.lock": "base-cu128.txt"}
    fine = _arch(tmp_path, SHIPPED.get("rivanna"), "interactive", cu128)
    assert fine.status == "pass" and not fine.warn


def test_image_cuda_sources() -> None:
    assert image_cuda(ImageFacts(LABELS))[:2] == ("cuda", (13, 0))
    assert image_cuda(ImageFacts({"org.train.lock": "base-cu128.txt"}))[:2] == ("cuda", (12, 8))
    assert image_cuda(ImageFacts({"org.train.lock": "base-cpu.txt"}))[0] == "cpu"
    assert image_cuda(ImageFacts({"org.train.base-image": "nvidia/cuda:12.4.1-runtime"}))[:2] \
        == ("cuda", (12, 4))
    assert image_cuda(ImageFacts({}, 'export CUDA_VERSION="11.8.0"'))[:2] == ("cuda", (11, 8))
    assert image_cuda(ImageFacts({}, "CUDA_VERSION=12.2.0\nPATH=/x"))[:2] == ("cuda", (12, 2))
    assert image_cuda(ImageFacts({"org.train.cuda": "12.6"}))[:2] == ("cuda", (12, 6))
    assert image_cuda(ImageFacts({"org.train.image": "x"}))[0] == "unknown"


def test_old_style_inspect_output_is_read() -> None:
    facts = _apptainer_facts("org.train.image: base\norg.train.lock: base-cu130.txt\n")
    assert facts.labels["org.train.lock"] == "base-cu130.txt"


# -- bad input, profile keys, output ---------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "field"), [
    ({"runtime": "podman"}, "runtime"),
    ({"partition_or_constraint": "h100"}, "partition"),
    ({"account": "lab; rm -rf ~"}, "account"),
    ({"account": ""}, "account"),
    ({"image": ""}, "image"),
    ({"image": "base\x00.sif"}, "image"),
    ({"runs_root": Path("runs\x00x")}, "runs"),
])
def test_bad_input_names_the_field(tmp_path: Path, kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"image": None, "account": None, "runs_root": tmp_path,
                            "partition_or_constraint": None, "runtime": "none",
                            "environ": {"PATH": ""}, "run": Script({}), **kwargs}
    with pytest.raises(ConfigError) as err:
        run_preflight(site(), **args)
    assert err.value.field == field


def test_unknown_constraint_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        run_preflight(SHIPPED.get("torch"), image=None, account=None, runs_root=tmp_path,
                      partition_or_constraint="h200|a100", runtime="none",
                      environ={"PATH": ""}, run=Script({}))
    assert err.value.field == "constraint" and "a100" in str(err.value)


def test_a_long_runs_root_is_a_failed_check_not_a_traceback(tmp_path: Path) -> None:
    got = preflight_of(site(), tmp_path, runtime="none", account="lab", partition="new",
                       runs_root=tmp_path / ("x" * 300) / "runs")[RUNS_ROOT]
    assert got.ok is False and got.fix


def test_shipped_profiles_name_the_sites_account_commands() -> None:
    assert SHIPPED.get("gilbreth").account_list_command == ("slist",)
    assert SHIPPED.get("rivanna").account_list_command == ("allocations",)
    assert SHIPPED.get("torch").account_list_command == ("my_slurm_accounts",)
    assert SHIPPED.get("local").single_host
    assert not any(SHIPPED.get(n).single_host for n in ("gilbreth", "rivanna", "torch"))


def test_driver_version_key() -> None:
    assert site().partitions["old"].driver_version == "550.54.15"
    assert site().partitions["plain"].driver_version is None
    number = site(partitions={"p": {**NODE, "driver_version": 550.54}})
    assert number.partitions["p"].driver_version == "550.54"


@pytest.mark.parametrize(("extra", "field"), [
    ({"partitions": {"p": {**NODE, "driver_version": "new"}}}, "partitions.p.driver_version"),
    ({"partitions": {"p": {**NODE, "driver_version": True}}}, "partitions.p.driver_version"),
    ({"partitions": {"p": {**NODE, "driver_version": [550]}}}, "partitions.p.driver_version"),
    ({"account": {"list_command": "slist"}}, "account.list_command"),
    ({"account": {"list_command": ["slist --all"]}}, "account.list_command[0]"),
    ({"account": {"list_command": ["$(id)"]}}, "account.list_command[0]"),
    ({"account": {"list_command": [3]}}, "account.list_command[0]"),
    ({"single_host": "yes"}, "single_host"),
])
def test_new_profile_keys_refuse_bad_values(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        site(**extra)
    assert err.value.field == f"profile site.{field}"


def test_format_and_json(tmp_path: Path) -> None:
    checks = list(preflight_of(site(), tmp_path, account=None, partition="new",
                               answers={}).values())
    lines = format_checks(checks)
    assert len(lines) == 6
    assert all(line.split()[0] in ("PASS", "WARN", "FAIL", "SKIP") for line in lines)
    fails = [line for line in lines if line.startswith("FAIL")]
    assert fails and all(" Fix: " in line for line in fails)
    data = checks_json(checks)
    assert data["ok"] is False and failed(checks)
    assert json.loads(json.dumps(data))["checks"][0]["name"] == RUNTIME
    assert {c["status"] for c in data["checks"]} <= {"pass", "warn", "fail", "skip"}
    passing = [replace(c, ok=True) for c in checks]
    assert checks_json(passing)["ok"] is True


def test_preflight_python_starting_with_a_dash_is_exit_2(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    proc = run_cli(["doctor", "--preflight", "--cluster", "local", "--python=-c"],
                   env={"TRAIN_DEFAULTS": str(tmp_path / "none.yaml")})
    assert proc.returncode == 2, proc.stderr
    assert "--python: '-c' is not an interpreter" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_image_whose_sif_header_promises_more_than_the_file_holds_fails(
        tmp_path: Path) -> None:
    """A SIF copy cut short keeps its header, which says where its data ends: the file is
    refused without running apptainer (train submit's check too)."""
    import struct

    image = tmp_path / "cut.sif"
    header = SIF_HEAD.ljust(96, b"\0") + struct.pack("<4q", 128, 0, 4096, 1_000_000)
    image.write_bytes(header + b"\0" * 4000)
    got = open_image(image, None, site(), [])[0]
    assert got.ok is False and "cut.sif is cut short: its SIF header says it holds " \
        "1004096 bytes, the file has 4128" in got.detail, got
    assert "copy or build it again" in got.fix
    whole = tmp_path / "whole.sif"
    whole.write_bytes(header.replace(struct.pack("<q", 1_000_000), struct.pack("<q", 0))
                      + b"\0" * 4000)
    assert open_image(whole, None, site(), [])[0].ok is not False
