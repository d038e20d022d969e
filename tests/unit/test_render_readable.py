"""The rendered script is for a researcher to read whole: at most 80 lines (every golden
job, sweeps included), no chain logic (the engine holds it: train.batch), and its last
command hands the chunk to the engine with the step's exact argv."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.golden.cases import CASES, RUN_ROOT, golden_path, rendered, resolved, script_step
from train.client.clusters.profiles import Registry
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import (
    STEP_WIDTH,
    apptainer_setup,
    render,
    step_argv,
    step_command_lines,
)
from train.client.slurm.resolve import resolve
from train.common.entry import entry_code

SCRIPT_LINES = 80  # a screen
GOLDEN_LINES = 3000  # tests/golden's scripts, all of them
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_script_fits_on_a_screen_and_only_sets_values_before_the_engine(case: str) -> None:
    """Bash runs the script top to bottom: nothing runs but the site's own set-up lines
    (apptainer's: the submitting shell's settings unset, the modules where apptainer is
    not on PATH) before the one command that hands the chunk to the engine."""
    lines = rendered(case).splitlines()
    assert len(lines) <= SCRIPT_LINES, "\n".join(lines)
    modules = set(apptainer_setup(resolved(case).profile.modules))
    start = next(i for i, line in enumerate(lines) if line.startswith("exec "))
    assignment = re.compile(r"^(export )?[A-Z_]+=")
    for line in lines[1:start]:
        assert (line.startswith("#") or line == "set -euo pipefail" or line in modules
                or assignment.match(line)), line
    assert lines[start] == 'exec python3 -E -s "$ENGINE" chunk "$0" "$@" -- \\'
    assert not any(re.match(r"^\s*[a-z_]+\(\) \{", line) for line in lines)  # no functions


def test_the_golden_scripts_are_short_in_all() -> None:
    total = sum(len(golden_path(case).read_text().splitlines()) for case in CASES)
    assert total <= GOLDEN_LINES


def test_the_package_holds_no_chain_logic_in_shell() -> None:
    """Shell only where a shell must be: no shell files in the package."""
    shell = [p for p in (ROOT / "src" / "train").rglob("*") if p.suffix in (".sh", ".bash")]
    assert shell == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_step_command_line_gives_the_step_argv(case: str) -> None:
    text = rendered(case)
    assert script_step(text) == step_argv(resolved(case))
    # one command, wrapped with ` \`: only an argument (or an option and its value) longer
    # than the width sticks out
    lines = [ln for ln in step_command_lines(resolved(case)) if not ln.startswith("#")]
    assert all(line.endswith(" \\") for line in lines[:-1])
    assert "\n".join(lines) in text
    for line in lines:
        if len(line) > STEP_WIDTH:
            assert len(shlex.split(line.rstrip(" \\"))) <= 2, line


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
    text = render(job)
    argv = step_argv(job)
    assert argv[-len(HOSTILE):] == list(HOSTILE)
    assert script_step(text) == argv
