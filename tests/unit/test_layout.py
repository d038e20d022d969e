"""The layout tells where code runs (docs/ARCHITECTURE.md): what the login node imports
stays torch-free, and no side imports the code of a side it does not run on. (The size
rules are in test_split_sizes.py.)"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "train"
# what runs on the login node (and at image build time on it): no torch, numpy, matplotlib
CLIENT_PACKAGES = ("train.cli", "train.client", "train.common", "train.batch", "train.images")
HEAVY = ("torch", "numpy", "matplotlib")


def _client_modules() -> list[str]:
    names = []
    for package in CLIENT_PACKAGES:
        folder = SRC.joinpath(*package.split(".")[1:])
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(SRC).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            names.append(".".join(["train", *parts]))
    return names


_BLOCKER = """
import importlib.abc, sys
HEAVY = {heavy!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"the client imported {{name}}")
        return None
sys.meta_path.insert(0, Block())
import importlib
for module in {modules!r}:
    importlib.import_module(module)
print(len({modules!r}))
"""


def _import_without_heavy(modules: list[str]) -> subprocess.CompletedProcess[str]:
    code = _BLOCKER.format(heavy=HEAVY, modules=modules)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, cwd=REPO)


def test_every_client_module_imports_with_torch_numpy_and_matplotlib_unimportable() -> None:
    modules = _client_modules()
    assert len(modules) > 20
    proc = _import_without_heavy(modules)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(len(modules))


@pytest.mark.parametrize("module", ["train.workloads.runtime.checkpoint"])
def test_the_blocker_does_block(module: str) -> None:
    proc = _import_without_heavy([module])
    assert proc.returncode != 0 and "the client imported" in proc.stderr, proc.stderr


def _imports(path: Path) -> set[str]:
    """Every train module a file imports, at module level or inside functions."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {name for name in found if name == "train" or name.startswith("train.")}


# who may not import whom: the side a folder's code runs on decides it
FORBIDDEN = {
    # of the workloads, the client takes the schema of what `train run` takes (config,
    # runrecord) and nothing else
    "client": ("train.node", "train.workloads.runtime", "train.workloads.dqn",
               "train.workloads.runner", "train.workloads.navsim", "train.workloads.envs"),
    "node": ("train.client", "train.cli", "train.workloads"),
    "workloads": ("train.client", "train.cli", "train.images"),
    "common": ("train.client", "train.node", "train.workloads", "train.cli", "train.images"),
    "batch": ("train",),  # the names both sides share: nothing of train below them
    "images": ("train.client", "train.cli", "train.node", "train.workloads"),
}


def crossings(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted((SRC / folder).rglob("*.py")):
        for name in sorted(_imports(path)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(REPO)} imports {name}")
    return out


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_each_side_imports_only_what_runs_where_it_runs(folder: str) -> None:
    assert (SRC / folder).is_dir()
    assert crossings(folder, FORBIDDEN[folder]) == []


def test_the_crossing_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from train.node import launch\n    return launch\n")
    assert _imports(module) == {"train.node", "train.node.launch"}
