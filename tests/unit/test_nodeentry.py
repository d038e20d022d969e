"""The bound launcher (train.node.nodeentry): what runs in an image without `train`. It must
import with the standard library alone (torch optional), run on MIN_PYTHON,
refuse an older Python in one line with exit 3, and leave the program it starts the
image's own environment (no `train`, PYTHONPATH untouched).

The launcher runs here as it runs in the container: a copy of the package in a folder of
its own (the bind), the entry code with that folder, an interpreter started without its
site-packages (-S: the standard library only) or pyenv's old interpreters where installed.
"""

from __future__ import annotations

import ast
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import train
from train.common import entry
from train.common.entry import MIN_PYTHON, bound_entry_code, bound_root
from train.node.launcher.step import expand

PYENV = Path("/root/.pyenv/versions")
# the modules `launch` starts from (a GPU step's too: the CUDA check, the watch; the entry's
# names, which the torch check and the watch's start import at run time); what they import
# in turn is found by importing them (_node_side)
ENTRY_MODULES = ("train.node.nodeentry", "train.node.launch", "train.node.signals",
                 "train.node.gpuwatch", "train.node.launcher.step",
                 "train.common.cuda_check", "train.common.entry")


def _python(version: str) -> str | None:
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    return str(found[0]) if found else shutil.which(f"python{version}")


def _bound(tmp_path: Path) -> Path:
    """The client's package copied where the container would see it bound."""
    root = tmp_path / "opt-train-launcher"
    shutil.copytree(Path(train.__file__).parent, root / "train",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _step_env(tmp_path: Path) -> dict[str, str]:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TRAIN_", "PYTHON"))}
    env.update({"SLURM_JOB_ID": str(random.randint(1, 19999)),
                "SLURM_JOB_NODELIST": "node[1-1]", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
                "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1",
                "SLURM_NTASKS_PER_NODE": "1", "SLURM_CPUS_PER_TASK": "1",
                "CUDA_VISIBLE_DEVICES": "", "TRAIN_MASTER_ADDR": "127.0.0.1",
                "TRAIN_RUN_DIR": str(run_dir),
                "TRAIN_STOP_REQUEST": str(run_dir / ".stop-request-1-0"),
                "PYTHONPATH": "/image/own/path"})  # the image's own setting
    return env


# what the program prints: its PYTHONPATH, whether `train` imports, the scontrol it finds
PROGRAM = ("import importlib.util, os, shutil; print(os.environ.get('PYTHONPATH'), "
           "importlib.util.find_spec('train') is not None, shutil.which('scontrol'))")


def _launch(python: list[str], root: Path, tmp_path: Path, *args: str
            ) -> subprocess.CompletedProcess[str]:
    code = bound_entry_code(root=str(root))
    folder = tmp_path / "submit"
    folder.mkdir(exist_ok=True)
    return subprocess.run([*python, "-c", code, "launch", *args], cwd=folder,
                          env=_step_env(tmp_path), capture_output=True, text=True,
                          timeout=120, check=False)


def _interpreters() -> list[list[str]]:
    found = [[sys.executable, "-S"]]  # this Python without its site-packages
    old = _python("3.9")
    if old is not None:
        found.append([old, "-S"])
    return found


@pytest.mark.parametrize("python", _interpreters(), ids=lambda p: Path(p[0]).name)
def test_the_bound_launcher_runs_with_the_stdlib_alone_and_hides_itself(
        tmp_path: Path, python: list[str]) -> None:
    root = _bound(tmp_path)
    proc = _launch(python, root, tmp_path, "--mode", "tasks", "--", python[0], "-S", "-c",
                   PROGRAM)
    assert proc.returncode == 0, proc.stderr
    pythonpath, sees_train, scontrol = proc.stdout.split()
    assert pythonpath == "/image/own/path" and sees_train == "False"
    assert scontrol == str(tmp_path / "run" / ".scontrol-shim" / "scontrol")  # the stand-in
    assert "rank 0/1" in proc.stderr


def test_torchrun_without_torch_is_one_line_and_exit_3(tmp_path: Path) -> None:
    proc = _launch([sys.executable, "-S"], _bound(tmp_path), tmp_path, "--mode", "torchrun",
                   "--", "true")
    assert proc.returncode == 3, proc.stderr
    assert "cannot import torch" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("version", ["3.8", "2.7"])
def test_a_python_older_than_the_minimum_is_one_line_and_exit_3(
        tmp_path: Path, version: str) -> None:
    python = _python(version)
    if python is None:  # (where pyenv's old interpreters are not installed)
        pytest.skip(f"no Python {version} here")
    proc = _launch([python], _bound(tmp_path), tmp_path, "--mode", "tasks", "--", "true")
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"Python is {version} " in lines[0], lines
    assert "needs Python >= 3.9" in lines[0]
    from train.client.doctor.logread import scan_log

    log = tmp_path / "job.err"
    log.write_text(proc.stderr)
    assert "train_error" in scan_log(log).hits, proc.stderr


def _node_side(tmp_path: Path) -> tuple[list[str], list[Path]]:
    """Import the entry modules from a bound copy with the standard library alone: (the
    top-level names of what else got imported, besides the standard library; the files
    of every module of ours that got imported)."""
    code = ("import sys; sys.path.append(sys.argv[1]); "
            + "; ".join(f"import {m}" for m in ENTRY_MODULES)
            + "; names = {m.split('.')[0] for m in sys.modules}; "
            "print(' '.join(sorted(n for n in names if n not in sys.stdlib_module_names "
            "and n not in ('train', '__main__')))); "
            "print('\\n'.join(sorted(m.__file__ for n, m in list(sys.modules.items()) "
            "if n == 'train' or n.startswith('train.'))))")
    root = _bound(tmp_path)
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(root)],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr
    first, *files = proc.stdout.split("\n")
    here = Path(train.__file__).parent
    return first.split(), [here / Path(f).relative_to(root / "train") for f in files if f]


def test_the_node_side_imports_nothing_but_the_standard_library(tmp_path: Path) -> None:
    others, files = _node_side(tmp_path)
    assert others == []
    assert len(files) >= len(ENTRY_MODULES)


def _imported_in_functions(path: Path) -> set[str]:
    """The modules of ours a module imports inside its functions (at run time)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.level == 0 and \
                        (inner.module or "").startswith("train."):
                    found.add(inner.module or "")
                elif isinstance(inner, ast.Import):
                    found |= {a.name for a in inner.names if a.name.startswith("train.")}
    return found


def test_the_checks_reach_what_the_node_side_imports_at_run_time(tmp_path: Path) -> None:
    """A module of ours the node side imports only inside a function (the torch check and
    the GPU watch's start take train.common.entry so) is held to the same lines (the
    standard library, Python 3.9) as the rest: ENTRY_MODULES reach it."""
    files = set(_node_side(tmp_path)[1])
    here = Path(train.__file__).parent
    lazy = set().union(*(_imported_in_functions(f) for f in files))
    assert "train.node.launch" in lazy  # (nodeentry's run_launch)

    def checked(module: str) -> bool:
        path = here.joinpath(*module.split(".")[1:])
        return path.with_suffix(".py") in files or path / "__init__.py" in files

    assert sorted(m for m in lazy if not checked(m)) == []


# Python 3.10+ features an AST shows: names that 3.9 lacks, keywords it does not take
NEWER_CALL_KEYWORDS = {("zip", "strict"), ("dataclass", "slots"), ("dataclass", "kw_only"),
                       ("dataclass", "match_args"), ("bisect", "key"), ("insort", "key")}
NEWER_NAMES = {"pairwise", "aclosing", "anext", "aiter", "bit_count", "TypeAlias",
               "ParamSpec", "TypeGuard", "Concatenate", "Self", "tomllib", "StrEnum",
               "ExceptionGroup", "TaskGroup", "UTC", "is_typeddict", "EncodingWarning"}


def _newer_than_39(tree: ast.Module, future: bool) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if type(node).__name__ in ("Match", "TryStar", "TypeAlias"):
            found.append(f"line {getattr(node, 'lineno', '?')}: {type(node).__name__} statement")
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            found += [f"line {node.lineno}: {name}({k.arg}=)" for k in node.keywords
                      if (name, k.arg) in NEWER_CALL_KEYWORDS]
            if name in ("isinstance", "issubclass") and len(node.args) == 2 \
                    and isinstance(node.args[1], ast.BinOp):
                found.append(f"line {node.lineno}: {name} with X | Y")
        elif isinstance(node, (ast.Name, ast.Attribute, ast.alias)):
            name = getattr(node, "id", None) or getattr(node, "attr", None) or \
                getattr(node, "name", "")
            if name in NEWER_NAMES:
                found.append(f"line {getattr(node, 'lineno', '?')}: {name}")
        elif isinstance(node, (ast.FunctionDef, ast.AnnAssign)) and not future:
            found.append(f"line {node.lineno}: annotations without "
                         "`from __future__ import annotations`")
    return found


def test_the_node_side_uses_nothing_newer_than_python_39(tmp_path: Path) -> None:
    assert MIN_PYTHON == (3, 9)  # (the checks below are for 3.9)
    problems = []
    for path in _node_side(tmp_path)[1]:
        if path.parent.name == "batch":  # held to 3.6 and run by it: test_engine_compat
            continue
        module = str(path)
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, feature_version=(3, 9)) if sys.version_info >= (3, 9) \
            else ast.parse(source)
        future = "from __future__ import annotations" in source
        problems += [f"{module}: {p}" for p in _newer_than_39(tree, future)]
    assert problems == []


def test_an_old_python_compiles_every_node_side_module(tmp_path: Path) -> None:
    python = _python("3.9")
    if python is None:
        pytest.skip("no Python 3.9 here: the AST check above stands alone")
    files = [str(f) for f in _node_side(tmp_path)[1]]
    code = ("import sys\nfor f in sys.argv[1:]:\n"
            "    compile(open(f).read(), f, 'exec')\n")
    proc = subprocess.run([python, "-c", code, *files], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("nodes", ["node1", "gpu[01-03,07],login5", "a[1-2]b[3-4]",
                                   "c[009-011]", "x-[1,3]y"])
def test_the_stdlib_node_list_agrees_with_python_hostlist(nodes: str) -> None:
    hostlist = pytest.importorskip("hostlist")
    assert expand(nodes) == list(hostlist.expand_hostlist(nodes))


@pytest.mark.parametrize("nodes", ["gpu[01-", "gpu]1[", "gpu[a-b]", "gpu[3-1]"])
def test_a_malformed_node_list_is_a_value_error(nodes: str) -> None:
    with pytest.raises(ValueError):
        expand(nodes)


def test_bound_root_is_the_folder_that_holds_the_package(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU watch of a bound launcher starts through the same entry: bound_root must
    name the folder the `train` package was loaded from, wherever common.entry sits in it."""
    import train

    holder = os.path.dirname(os.path.dirname(os.path.abspath(train.__file__)))
    assert bound_root() is None  # loaded from the checkout, not a bound copy
    monkeypatch.setattr(entry, "LAUNCHER_ROOT", holder)
    assert bound_root() == holder
