"""The chain engine runs on what the batch host has: its own copy in the run folder
(train.batch.engine.install), the node's python3 (3.6 on EL8), the standard library only.
The whole engine suite (test_chain_engine*.py) runs its copy with the oldest Python this
machine has (ENGINE_PYTHON); these check what holds on any."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.engine_python import ENGINE_PYTHON
from train.batch import contract
from train.batch.engine import MIN_PYTHON, MODULES, install

BATCH = Path(__file__).resolve().parents[2] / "src" / "train" / "batch"


@pytest.mark.parametrize("name", MODULES)
def test_every_engine_module_is_python_36_and_standard_library_only(name: str) -> None:
    text = (BATCH / name).read_text(encoding="utf-8")
    tree = ast.parse(text, feature_version=MIN_PYTHON)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.module != "__future__", "annotations are evaluated in 3.6"
            top = (node.module or "").split(".")[0]
            assert top in sys.stdlib_module_names or node.module.startswith("train.batch")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] in sys.stdlib_module_names, alias.name
        elif isinstance(node, ast.keyword):  # subprocess's 3.7 names
            assert node.arg not in ("capture_output", "text"), node.arg
        elif isinstance(node, ast.JoinedStr):
            pytest.fail(f"{name}: an f-string (3.6 has them, but the copy keeps to format)")


def test_the_copy_runs_alone_and_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    engine = install(str(run))
    assert sorted(p.name for p in (Path(engine) / "train" / "batch").glob("*.py")) \
        == sorted(MODULES)
    base = [ENGINE_PYTHON, "-E", "-s", engine]
    proc = subprocess.run([*base, "chunk", "s", "1"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and "usage: ENGINE chunk" in proc.stderr
    proc = subprocess.run([*base, "chunk", "s", "1", "--", "true"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "holds no job record" in proc.stderr
    (run / contract.CHAIN_RECORD).write_text(json.dumps({"job": {"run_dir": str(run)}}))
    proc = subprocess.run([*base, "chunk", "s", "1", "--", "true"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "the job record lacks max_chunks" in proc.stderr
    proc = subprocess.run([*base, "nonsense"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2 and "usage" in proc.stderr
