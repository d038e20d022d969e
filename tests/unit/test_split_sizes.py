"""House rules of the source tree (issue 23): no module over 500 lines and no function
over 60 (nested ones too), in every Python module and every shell file under src/train;
and building the `train` command's parser loads no login-node code (`python -m train
launch` runs it on every node)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "train"
AREAS = sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)  # every module
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def test_the_areas_are_packages_of_several_modules() -> None:
    assert len(AREAS) >= 100, AREAS  # the whole tree, not a part of it


@pytest.mark.parametrize("path", AREAS, ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_or_function_over_the_limits(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_the_command_parser_imports_no_login_node_code() -> None:
    """`python -m train launch` runs in the container on every node: building the parser
    (which every command does) loads no Slurm client, doctor, preflight or image tools;
    each command's handler imports those when it runs."""
    import subprocess
    import sys

    code = ("import sys\nfrom train.cli import build_parser\nbuild_parser()\n"
            "print('\\n'.join(sorted(sys.modules)))\n")
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, text=True,
                                capture_output=True).stdout.split())
    assert {"train.cli.launch", "train.cli.jobs", "train.cli.runs"} <= loaded
    login_only = ("train.client.slurm.cancel", "train.client.slurm.queue", "train.client.slurm.submission",
                  "train.client.slurm.chainstatus", "train.client.doctor", "train.client.preflight",
                  "train.images", "train.client.clusters.probe", "train.client.defaults", "torch", "numpy",
                  "matplotlib")
    assert sorted(loaded & set(login_only)) == []


SHELL_FILES = sorted(SRC.rglob("*.sh"))
_BASH_FUNCTION = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\(\) \{")


def long_bash_functions(text: str) -> list[str]:
    """Top-level bash functions (`name() {` at column 0 to the next `}` at column 0)
    longer than the limit, each as "name (N lines)"."""
    long, name, start = [], "", 0
    for number, line in enumerate(text.splitlines(), 1):
        match = _BASH_FUNCTION.match(line)
        if match and not name:
            name, start = match.group(1), number
        elif name and line.startswith("}"):
            if number - start + 1 > MAX_FUNCTION_LINES:
                long.append(f"{name} ({number - start + 1} lines)")
            name = ""
    return long


def test_the_bash_checker_catches_a_long_function() -> None:
    body = "\n".join(f"    echo {i}" for i in range(58))
    assert long_bash_functions(f"ok() {{\n{body}\n}}\n") == []  # 60 lines
    assert long_bash_functions(f"f() {{\n{body}\n    echo x\n}}\n") == ["f (61 lines)"]


def test_the_shell_files_are_found() -> None:
    assert {p.name for p in SHELL_FILES} >= {"job-lib.sh", "job-lib-step.sh"}


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_shell_file_or_bash_function_over_the_limits(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    assert long_bash_functions(text) == []
