"""The rendered script's layout: what a researcher reads first (at most 60 lines), one
marker line naming the chain library's version, and everything generated below it; the
step command shown there gives bash exactly the step's argv."""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import Any

import pytest

from tests.golden.cases import CASES, RUN_ROOT, rendered, resolved, script_step
from train.client import container
from train.client.clusters.profiles import Registry
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import (
    LIBRARY_NAMES,
    STEP_WIDTH,
    _strip_header,
    apptainer_setup,
    library_paths,
    library_text,
    marker_line,
    render,
    step_argv,
    step_command_lines,
)
from train.client.slurm.resolve import resolve
from train.common.entry import entry_code

READABLE_LINES = 60
LIBRARY = library_text()


def test_every_library_file_is_inlined_in_order_shipped_and_linked() -> None:
    """The library's files go below the marker in their fixed order, each one whole (the
    version covers all of them); the package ships each, and slurm/ links to each."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    _, rest = _parts(rendered(sorted(CASES)[0]))
    below = "\n".join(rest)
    starts = [below.index(_strip_header(path.read_text(encoding="utf-8")))
              for path in library_paths()]
    assert len(starts) == len(LIBRARY_NAMES) >= 2 and starts == sorted(starts)
    (shipped,) = [line for line in (root / "pyproject.toml").read_text(
        encoding="utf-8").splitlines() if line.startswith("train = [")]  # package-data
    for name, path in zip(LIBRARY_NAMES, library_paths(), strict=True):
        assert f'"batch/{name}"' in shipped
        assert (root / "slurm" / name).resolve() == path.resolve()


def _parts(text: str) -> tuple[list[str], list[str]]:
    lines = text.splitlines()
    markers = [i for i, line in enumerate(lines) if line.startswith("# ---- train chain")]
    assert len(markers) == 1, "one marker line"
    return lines[:markers[0]], lines[markers[0]:]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_readable_part_is_short_and_the_marker_names_the_library_version(
        case: str) -> None:
    top, rest = _parts(rendered(case))
    assert len(top) <= READABLE_LINES, "\n".join(top)
    version = hashlib.sha256(_strip_header(LIBRARY).encode("utf-8")).hexdigest()[:12]
    assert rest[0] == marker_line(LIBRARY)
    assert f"(version {version})" in rest[0] and "do not edit below" in rest[0]
    # the library itself, the contract's names and the per-node wrapper are all below
    assert "train_main() {" in rest and "train_main() {" not in top
    assert not any(line.startswith(("COMPLETE_FILE=", "EV_", "NODE_WRAPPER=")) for line in top)
    assert rest[-1] == 'train_main "$@"'


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_readable_part_only_sets_variables(case: str) -> None:
    """Bash runs the script top to bottom: above the marker, nothing runs but the site's
    own set-up lines (apptainer's: the submitting shell's settings unset, the modules where
    apptainer is not on PATH)."""
    top, _ = _parts(rendered(case))
    modules = set(apptainer_setup(resolved(case).profile.modules))
    body = top.index("step_command() {")
    assert top[body + 1].startswith("    STEP=(") and top[-1] == "}"
    assignment = re.compile(r"^(export )?[A-Z_]+=")
    for line in top[1:body]:
        assert (line.startswith("#") or line == "set -euo pipefail" or line in modules
                or assignment.match(line)), line


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_step_command_line_gives_the_step_argv(case: str) -> None:
    text = rendered(case)
    assert script_step(text) == step_argv(resolved(case))
    # one command, wrapped with ` \`: only an argument (or an option and its value) longer
    # than the width sticks out
    lines = step_command_lines(resolved(case))
    assert all(line.endswith(" \\") for line in lines[:-1]) and lines[-1].endswith(")")
    assert "\n".join(lines) in text
    for line in lines:
        if len(line) > STEP_WIDTH:
            assert len(shlex.split(line.removeprefix("    STEP=(").rstrip(" \\)"))) <= 2, line


HOSTILE = ("--lr", "3e-4", "a b", "it's", '"dq"', "$HOME", "${X:-y}", "$(id)", "`id`",
           "line\nbreak", "\n", "back\\", "\\", "", "-c", entry_code(), "x" * 200, "-",
           "--", "tab\there", "ünï", "a;b|c&d", "*", "~", "!x", "#nocomment")


@pytest.mark.parametrize("runtime", ["none", "docker", "apptainer"])
def test_hostile_arguments_reach_the_step_unchanged(runtime: str) -> None:
    values: dict[str, Any] = dict(
        cluster="local", name="h", nodes=2, gpus_per_node=1, cpus_per_task=1, mem="1000M",
        entry="command", runtime=runtime, launch="torchrun",
        image={"none": None, "docker": "train-base:ci", "apptainer": "/x/base.sif"}[runtime],
        workload=("python3", "fit.py", *HOSTILE))
    spec = JobSpec(**{"out": f"{RUN_ROOT}/h", **values})
    job = resolve(spec, Registry(environ={}).get(spec.cluster))
    text = render(job, LIBRARY)
    argv = step_argv(job)
    assert argv[-len(HOSTILE):] == list(HOSTILE)
    assert script_step(text) == argv
    top, rest = _parts(text)
    if runtime == "docker":
        # the wrapper's text is below the marker, the command names it
        assert container.DOCKER_TASK not in "\n".join(top)
        assert shlex.quote(container.DOCKER_TASK) in "\n".join(rest)
        assert 'bash -c "$NODE_WRAPPER" train-task' in "\n".join(top)
