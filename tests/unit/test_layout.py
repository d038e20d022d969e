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
    "client": ("train.cli", "train.node", "train.workloads.runtime", "train.workloads.dqn",
               "train.workloads.runner", "train.workloads.navsim", "train.workloads.envs"),
    "node": ("train.client", "train.cli", "train.workloads"),
    "workloads": ("train.client", "train.cli", "train.images"),
    "common": ("train.client", "train.node", "train.workloads", "train.cli", "train.images"),
    "batch": ("train",),  # the chain engine, copied alone: nothing of train outside it
    "images": ("train.client", "train.cli", "train.node", "train.workloads"),
}


def crossings(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted((SRC / folder).rglob("*.py")):
        for name in sorted(_imports(path)):
            if name.startswith(f"train.{folder}.") or name == f"train.{folder}":
                continue  # (a folder's own modules)
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


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _module_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {n for n in _imports(p) if n in modules and n != m}
            for m, p in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected parts of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = [stack.pop()]
            while part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert circles(_module_graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def _definitions(path: Path) -> tuple[set[str], set[str]]:
    """The names a module defines at top level, and the names it imports there."""
    defined: set[str] = set()
    imported: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        inner = [node] if not isinstance(node, (ast.If, ast.Try)) else list(ast.walk(node))
        for item in inner:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(item.name)
            elif isinstance(item, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                defined.update(n.id for t in targets for n in ast.walk(t)
                               if isinstance(n, ast.Name))
            elif isinstance(item, (ast.Import, ast.ImportFrom)):
                imported.update(a.asname or a.name for a in item.names)
    return defined, imported


def passed_on(files: list[Path], root: Path = REPO) -> list[str]:
    """Every `from train.X import NAME` in these files where X does not define NAME (it
    only imports it: a name passed on) and NAME is not a module of the package X."""
    modules = _modules()
    defined = {m: _definitions(p)[0] for m, p in modules.items()}
    out = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module in modules):
                continue
            for alias in node.names:
                if alias.name not in defined[node.module] and \
                        f"{node.module}.{alias.name}" not in modules:
                    out.append(f"{path.relative_to(root)}:{node.lineno} takes "
                               f"{alias.name} from {node.module}")
    return out


def test_every_name_is_imported_from_the_module_that_defines_it() -> None:
    files = [*SRC.rglob("*.py"), *(REPO / "tests").rglob("*.py"),
             *(REPO / "benchmarks").rglob("*.py")]
    assert passed_on(files) == []


def only_imports(text: str) -> bool:
    """Whether a module's top level is imports (of more than __future__), a docstring and
    __all__ alone: it exists only to pass names on."""
    body = ast.parse(text).body
    rest = [n for n in body if not (
        isinstance(n, (ast.Import, ast.ImportFrom))
        or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        or (isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)))]
    imports = [n for n in body if isinstance(n, ast.Import)
               or (isinstance(n, ast.ImportFrom) and n.module != "__future__")]
    return bool(imports) and not rest


def test_no_module_only_passes_names_on() -> None:
    """A package's __init__ may be its docstring alone; no module is imports alone."""
    assert [m for m, p in _modules().items()
            if only_imports(p.read_text(encoding="utf-8"))] == []


def test_the_checks_see_a_name_passed_on_and_a_module_of_imports_alone(tmp_path: Path
                                                                          ) -> None:
    user = tmp_path / "user.py"
    user.write_text("from train.client.slurm.jobspec import JobSpec\n"
                    "from train.client.slurm.resolve import JobSpec as Again\n")
    assert [line.split(" ", 1)[1] for line in passed_on([user], tmp_path)] == [
        "takes JobSpec from train.client.slurm.resolve"]
    assert only_imports("from __future__ import annotations\nimport os\n__all__ = []\n")
    assert not only_imports("import os\nX = os.sep\n")
    assert not only_imports("\"\"\"A package's face.\"\"\"\n")
