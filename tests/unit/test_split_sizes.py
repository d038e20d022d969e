"""House rules of the source tree (issue 23): no module over 500 lines and no function
over 60 (nested ones too), in every Python module under src/train (it holds no shell
file: tests/unit/test_render_readable.py);
and building the `train` command's parser loads no login-node code (`python -m train
launch` runs it on every node)."""

from __future__ import annotations

import ast
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
    login_only = ("train.client.slurm.chain", "train.client.slurm.queue", "train.client.slurm.submission",
                  "train.client.slurm.chainstatus", "train.client.doctor", "train.client.preflight",
                  "train.images", "train.client.clusters.probe", "train.client.defaults", "torch", "numpy",
                  "matplotlib")
    assert sorted(loaded & set(login_only)) == []
