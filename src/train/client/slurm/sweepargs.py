"""A command sweep's arguments, task by task.

In a `--entry command` sweep the words `{value}`, `{index}` and `{task_dir}` in the
command's arguments (and in --resume-args, --save-path and --chdir) are replaced, for each
task, by the task's value, its index in the job array and its own folder (runs/NAME/task-I,
or seed-S): plain text put in place when the task's chain script is rendered, never read
by a shell. The tasks run in the folder the command was submitted from (or --chdir), so
the program finds its files where it would alone; `{task_dir}` is where each task writes
its own outputs (e.g. `--output_dir {task_dir}`), and `--chdir {task_dir}` runs each task
in its own folder (a program that saves where it runs: made before the task starts).

What goes wrong without them is said at render and submit: a `$TRAIN_SWEEP_VALUE` among
the arguments reaches the program as those letters (refused), a --save-path every task
would share (refused: each would resume from another's saves), a sweep whose tasks all run
the same arguments, an output folder every task would share and tasks that all run in one
folder (warnings).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from typing import Any

from train.client.programs import SCRIPT_LIMIT, script_of
from train.common.errors import ConfigError

VALUE, INDEX, TASK_DIR = "{value}", "{index}", "{task_dir}"
MARKERS = (VALUE, INDEX, TASK_DIR)
_SHELLS = re.compile(r"(ba|z|da|k)?sh")
# what a shell would have expanded: the task's variables written into an argument
_SHELL_VARIABLE = re.compile(r"\$\{?TRAIN_(SWEEP_VALUE|SWEEP_INDEX|RUN_DIR)\b")
# an option naming where a program writes (--output_dir, --save-dir, --default_root_dir)
_OUTPUT_OPTION = re.compile(r"--?([a-z_]*_)?(output|out|save|log|logging|ckpt|checkpoint|"
                            r"checkpoints|default_root|results?)[_-]?(dir|path|folder)")


_MARKER = re.compile("|".join(re.escape(m) for m in MARKERS))


def _replaced(text: str, value: str, index: int, task_dir: str) -> str:
    """Every marker of `text` replaced in one pass: a value that holds a marker's letters
    ({index}, {task_dir}) is put in as written, never replaced again."""
    by_marker = {VALUE: value, INDEX: str(index), TASK_DIR: task_dir}
    return _MARKER.sub(lambda found: by_marker[found.group(0)], text)


def task_changes(workload: Sequence[str], resume_args: str | None,
                 save_path: Sequence[str], chdir: str | None, index: int, value: str,
                 task_dir: str) -> dict[str, Any]:
    """The job spec's changes for one task of a command sweep: each marker replaced (in
    --resume-args by the value quoted, since those are split as a shell would)."""
    changes: dict[str, Any] = {
        "workload": tuple(_replaced(a, value, index, task_dir) for a in workload),
        "save_path": tuple(_replaced(p, value, index, task_dir) for p in save_path),
        "chdir": None if chdir is None else _replaced(chdir, value, index, task_dir)}
    if resume_args is not None:
        changes["resume_args"] = _replaced(resume_args, shlex.quote(value), index,
                                           shlex.quote(task_dir))
    return changes


def _run_by_shell(command: Sequence[str]) -> bool:
    """`bash -c '...'` (or sh, zsh, ...): a shell that expands what it is given."""
    return bool(command) and _SHELLS.fullmatch(os.path.basename(command[0])) is not None \
        and "-c" in command[1:]


def check_command(command: Sequence[str], field: str) -> None:
    """Refuse `$TRAIN_SWEEP_VALUE` (or the index, or TRAIN_RUN_DIR) written into an
    argument of a program no shell starts: no shell expands it, the program gets the
    letters."""
    if _run_by_shell(command):
        return
    for arg in command:
        found = _SHELL_VARIABLE.search(arg)
        if found is None:
            continue
        marker = {"SWEEP_VALUE": VALUE, "SWEEP_INDEX": INDEX}.get(found.group(1), TASK_DIR)
        raise ConfigError(field, f"{arg!r} reaches the program as written (no shell expands "
                          f"the command's arguments): write {marker} where the task's "
                          f"{found.group(1).lower().replace('_', ' ')} goes, e.g. "
                          f"{arg.replace(found.group(0), marker)!r}; each task gets its "
                          "own, as plain text")


def check_unmarked(env: Sequence[str], bind: Sequence[str]) -> None:
    """Refuse a marker where none is replaced (--env, --bind): the program would get its
    letters, the same in every task."""
    for field, items in (("env", env), ("bind", bind)):
        for item in items:
            marker = _MARKER.search(item)
            if marker is not None:
                raise ConfigError(field, f"{item!r}: {marker.group(0)} is replaced only in "
                                  "the command's arguments, --resume-args, --save-path and "
                                  "--chdir; the program finds its task's value, index and "
                                  "folder in TRAIN_SWEEP_VALUE, TRAIN_SWEEP_INDEX and "
                                  "TRAIN_RUN_DIR")


def check_save_paths(save_path: Sequence[str], chdir: str | None) -> None:
    """Refuse a --save-path every task would share: each task's chain takes a save there
    for its own (a checkpointed stop) and the program resumes from another task's."""
    own_folder = chdir is not None and _MARKER.search(chdir) is not None
    for item in save_path:
        if _MARKER.search(item) is None and (os.path.isabs(item) or not own_folder):
            raise ConfigError("save_path", f"{item!r} is the same path for every task of "
                              "the sweep: each would take another's saves for its own and "
                              "resume from them. Give each task its own: --chdir {task_dir} "
                              "(each task runs in its own folder; relative save paths are "
                              "from there), or a save path with {task_dir} (or {value}) in "
                              "it, where the task's program saves")


def _mentions(command: Sequence[str], folder: str | None, word: bytes) -> bool:
    """Whether the command's script (where the login node can read it) holds `word`."""
    path = script_of(command, folder)
    if path is None:
        return False
    try:
        with open(path, "rb") as fh:
            return word in fh.read(SCRIPT_LIMIT)
    except OSError:
        return False


def _shared_outputs(command: Sequence[str]) -> list[str]:
    """The output options of the command whose value names no task's own folder."""
    out = []
    for i, arg in enumerate(command):
        name, eq, given = arg.partition("=")
        if not _OUTPUT_OPTION.fullmatch(name.lower()):
            continue
        value = given if eq else (command[i + 1] if i + 1 < len(command) else "")
        if value and not value.startswith("-") and TASK_DIR not in value \
                and "TRAIN_RUN_DIR" not in value:
            out.append(f"{name} {value}")
    return out


def sweep_notes(command: Sequence[str], resume_args: str | None,
                folder: str | None) -> list[str]:
    """Warnings for a command sweep: tasks that all run the same arguments, output folders
    every task shares, and tasks that all run in one folder with nothing of their own."""
    notes = []
    if not any(TASK_DIR in w for w in [*command, resume_args or ""]) and \
            not _MARKER.search(folder or "") and not _mentions(command, folder,
                                                                b"TRAIN_RUN_DIR"):
        where = os.path.abspath(folder or ".")
        notes.append(f"the tasks of this sweep all run in {where} (and no {{task_dir}} or "
                     "TRAIN_RUN_DIR gives them a folder of their own): a program that saves "
                     "where it runs (a snapshot.pt, checkpoints/) would resume from "
                     "another task's saves. --chdir {task_dir} runs each task in its own "
                     "folder")
    words = [*command, resume_args or ""]
    if not any(m in w for w in words for m in (VALUE, INDEX)) and not \
            any("TRAIN_SWEEP_" in w for w in words) and \
            not _mentions(command, folder, b"TRAIN_SWEEP_"):
        notes.append("every task of this sweep runs the same command (no {value} or "
                     "{index} among its arguments, and no TRAIN_SWEEP_VALUE in its script): "
                     "write {value} where the task's value goes, e.g. -- python train.py "
                     "--lr {value}, or read TRAIN_SWEEP_VALUE in the program")
    for option in _shared_outputs(command):
        notes.append(f"every task of this sweep writes to {option} (the tasks run in the "
                     f"same folder): give each its own with {{task_dir}}, e.g. "
                     f"{option.split()[0]} {{task_dir}}/out")
    return notes
