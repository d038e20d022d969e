"""docs/newcomer-jobs.md cannot rot: every job's command lines (with the page's `train init`
line of its site, and without defaults) render (`train render`, the dry run: no cluster, no
sbatch), exit 0 with nothing `train submit` would refuse, and the line with defaults is the
shorter. Run as the installed `train` is: `python -m train` would run the submit folder's
own train.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGE = REPO / "docs" / "newcomer-jobs.md"
# a job: its numbered heading, then a bash block of its command with your defaults and
# without them, each line under its comment
JOB = re.compile(r"^## \d+\. (?:(?!\n## ).)*?\n```bash\n# with your defaults\n(train submit [^\n]*)\n"
                 r"# without them\n(train submit [^\n]*)\n```", re.M | re.S)
# what this machine cannot be: a login node that mounts the site's shared file systems
# (the profile's binds, /scratch where the images are)
ELSEWHERE = ("binds: the profile", "copy it to a file system the compute nodes mount")
# `apptainer inspect` of the base image as containers/base.def builds it by default (CUDA
# 13: no V100, so the page's Rivanna jobs ask for A100s), so the GPU architecture check runs
# whether or not this machine has an apptainer of its own
APPTAINER = """#!/bin/sh
if [ "$1" = inspect ]; then
    echo '{"data": {"attributes": {"labels": {"org.train.image": "base", \
"org.train.lock": "base-cu130.txt", "org.train.torch": "2.13.0", \
"org.train.base-image": "nvidia/cuda:13.0.0-runtime-ubuntu24.04"}, "environment": {}}}}'
    exit 0
fi
echo "apptainer stand-in: $*" >&2; exit 1
"""
# a script that keeps the walltime contract: saves under the run folder on USR1, exits 0
SCRIPT = """import os
import signal
import sys


def stop(signum, frame):
    open(os.path.join(os.environ["TRAIN_RUN_DIR"], "ckpt"), "w").close()
    sys.exit(0)


signal.signal(signal.SIGUSR1, stop)
"""


def rows() -> list[tuple[str, str]]:
    """(with defaults or not, the command) of every job, in page order."""
    return [row for ours, bare in JOB.findall(PAGE.read_text())
            for row in (("with defaults", ours), ("without", bare))]


def init_lines() -> dict[str, str]:
    block = re.search(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    assert block is not None
    lines = [line for line in block.group(1).splitlines() if line.startswith("train init")]
    return {shlex.split(line)[shlex.split(line).index("--cluster") + 1]: line
            for line in lines}


def words(command: str) -> list[str]:
    """The words before the program's `--`, after `train submit`."""
    argv = shlex.split(command)[2:]
    return argv[:argv.index("--")] if "--" in argv else argv


def flag_count(command: str) -> int:
    """Option words, short or long; a value is not one (--resume-args's value, itself
    written as a flag, neither)."""
    argv = words(command)
    return sum(1 for i, word in enumerate(argv)
               if word.startswith("-") and (i == 0 or argv[i - 1] != "--resume-args"))


def jobs() -> list[tuple[str, str, str]]:
    """(id, site, command) of every row; a with-defaults row's site is its pair's -M."""
    found = rows()
    out = []
    for n in range(0, len(found), 2):
        (_, ours), (_, bare) = found[n], found[n + 1]
        site = words(bare)[words(bare).index("-M") + 1]
        out += [(f"{n // 2 + 1}-init", site, ours), (f"{n // 2 + 1}-bare", site, bare)]
    return out


def test_the_page_holds_eight_jobs_with_and_without_defaults() -> None:
    found = rows()
    assert [kind for kind, _ in found] == ["with defaults", "without"] * 8
    assert len(re.findall(r"^## \d+\. ", PAGE.read_text(), re.M)) == 8  # none unparsed
    assert set(init_lines()) == {"gilbreth", "rivanna", "torch"}
    for n in range(0, len(found), 2):
        ours, bare = found[n][1], found[n + 1][1]
        assert "-M" not in words(ours) and "-M" in words(bare), (ours, bare)
        assert flag_count(ours) < flag_count(bare), (ours, bare)
        # the same job: the defaults replace flags, never the program or its arguments
        assert shlex.split(ours)[shlex.split(ours).index("--"):] == \
            shlex.split(bare)[shlex.split(bare).index("--"):], (ours, bare)


def _stand_ins(tmp_path: Path, text: str) -> str:
    """The command with its /scratch paths in tmp_path, and what they name made: a file
    with a SIF's header for each image, NAVSIM's data folders for --data."""
    scratch = tmp_path / "scratch"
    text = text.replace("/scratch/gilbreth/$USER", str(scratch))
    text = text.replace("/scratch/$USER", str(scratch))
    argv = shlex.split(text)
    for at, word in enumerate(argv):
        if word.endswith(".sif"):
            sif = Path(word)
            sif.parent.mkdir(parents=True, exist_ok=True)
            head = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0")
            sif.write_bytes(head + b"SIF_MAGIC\0" + b"01\0" + b"\0" * 1024)
        if at and argv[at - 1] == "--data":
            for folder in ("dataset/maps", "exp"):
                (Path(word) / folder).mkdir(parents=True, exist_ok=True)
    return text


def _train(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "train", *args], cwd=cwd,
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=180, check=False)


def _login_node(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A job folder holding SCRIPT, and the environment of a login node whose apptainer
    answers the base image's labels: a home and defaults file of the test's own."""
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "apptainer").write_text(APPTAINER)
    (tmp_path / "bin" / "apptainer").chmod(0o755)
    (tmp_path / "home").mkdir()
    return folder, {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                    "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": "",
                    "XDG_CACHE_HOME": str(tmp_path / "cache"), "TRAIN_CLUSTERS_PATH": "",
                    "TRAIN_DEFAULTS": str(tmp_path / "defaults.yaml")}


@pytest.mark.parametrize(("job", "site", "command"), jobs(), ids=[job[0] for job in jobs()])
def test_every_command_of_the_page_renders(tmp_path: Path, job: str, site: str,
                                           command: str) -> None:
    folder, env = _login_node(tmp_path)
    if job.endswith("-init"):
        init = _train(shlex.split(_stand_ins(tmp_path, init_lines()[site]))[1:], env, folder)
        assert init.returncode == 0, init.stderr
    argv = shlex.split(_stand_ins(tmp_path, command))
    assert argv[:2] == ["train", "submit"]
    proc = _train(["render", *argv[2:]], env, folder)
    assert proc.returncode == 0, (command, proc.stderr)
    assert "#SBATCH" in proc.stdout
    said = [line for line in proc.stderr.splitlines()
            if line.strip() and not any(text in line for text in ELSEWHERE)]
    assert not said, (command, said)


@pytest.mark.parametrize(("gpu_type", "refused"), [(None, True), ("v100", True),
                                                   ("a100", False)])
def test_the_architecture_check_compares_the_gpu_type_the_job_asks_for(
        tmp_path: Path, gpu_type: str | None, refused: bool) -> None:
    """Rivanna's gpu partition holds V100s beside A100s: the default CUDA 13 image has no
    code for the V100 (sm_70). A job that asks for A100s is not refused for the V100s it
    cannot land on; one that names no type, or the V100, is."""
    folder, env = _login_node(tmp_path)
    command = _stand_ins(tmp_path, "train submit -M rivanna -A mygroup --image "
                         "/scratch/$USER/train-base.sif -g 4 -t 4:00:00 -e command"
                         + (f" --gpu-type {gpu_type}" if gpu_type else "")
                         + " -- python train.py")
    proc = _train(["render", *shlex.split(command)[2:]], env, folder)
    assert proc.returncode == 0, proc.stderr
    said = "sm_70" in proc.stderr and "would refuse" in proc.stderr
    assert said == refused, proc.stderr
