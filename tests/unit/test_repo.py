"""The README's promises: two command lines first, the second is what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO


def _command_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_command_lines() -> None:
    text = (REPO / "README.md").read_text()
    first_block = text.index("```bash")
    assert text[:first_block].count("\n") <= 3  # only the title comes before them
    lines = _command_lines()
    assert len(lines) == 2
    assert "demo" in lines[0]
    assert "tests" in lines[1]


def test_ci_runs_the_readme_test_line() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert _command_lines()[1] in ci


def test_constraints_pin_cpu_torch_and_package_asks_a_range() -> None:
    constraints = (REPO / "ci" / "constraints.txt").read_text()
    assert re.search(r"^torch==\d+\.\d+\.\d+$", constraints, re.M)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'"torch>=[\d.]+,<\d+"', pyproject)


def readme_recipes() -> list[list[str]]:
    """The README's `train submit` recipes with {newest:GLOB} resume arguments, as argv."""
    import shlex

    text = (REPO / "README.md").read_text()
    return [shlex.split(line.strip())[1:] for line in text.splitlines()
            if line.strip().startswith("train submit") and "{newest:" in line]


def test_the_readmes_resume_recipes_render_as_written(tmp_path: Path) -> None:
    import sys

    from tests.conftest import run_cli
    from tests.golden.cases import script_array

    recipes = readme_recipes()
    assert len(recipes) == 2  # the Trainer's and Lightning's
    for argv in recipes:
        assert argv[0] == "submit"
        cut = argv.index("--")
        (tmp_path / argv[cut + 2]).write_text("")  # the program's script
        argv[argv.index("-t") + 1] = "30"  # (the local cluster's partition: an hour)
        proc = run_cli(["render", "--name", "r", "--cluster", "local", "--runtime", "none",
                        "--python", sys.executable, *argv[1:]], cwd=tmp_path)
        assert proc.returncode == 0, (argv, proc.stderr)
        resume = script_array(proc.stdout, "RESUME_ARGS")
        assert any("{newest:" in word for word in resume), resume
