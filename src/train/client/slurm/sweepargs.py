"""A command sweep's arguments, task by task: `{value}`, `{index}` and `{task_dir}` in the
command's arguments, --resume-args, --save-path and --chdir become, for each task, its
value, its index in the job array and its own folder: plain text put in place when its
chain script is rendered, never read by a shell.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Sequence
from typing import Any

from train.client.programs import script_text
from train.client.slurm import resumeargs
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.resumeargs import EXAMPLE, MARKER, NEWEST, OPEN, TEXT, patterns, pieces
from train.common.errors import ConfigError

VALUE, INDEX, TASK_DIR = MARKERS = tuple("{" + name + "}" for name in resumeargs.MARKER_NAMES)
_SHELLS = re.compile(r"(ba|z|da|k)?sh")
# what a shell would have expanded: the task's variables written into an argument
_SHELL_VARIABLE = re.compile(r"\$(\{)?TRAIN_(SWEEP_VALUE|SWEEP_INDEX|RUN_DIR)\b(?(1)\})")
# an option naming where a program writes (--output_dir, --save-dir, --default_root_dir)
_OUTPUT_OPTION = re.compile(r"--?([a-z_]*_)?(output|out|save|log|logging|ckpt|checkpoint|"
                            r"checkpoints|default_root|results?)[_-]?(dir|path|folder)")


_MARKER = re.compile("|".join(re.escape(m) for m in MARKERS))
# what a value put into a {newest:GLOB} may not hold: it would be a live pattern there
_GLOB_SPECIAL = re.compile(r"[*?\[\]{}\\]")
_WHERE = {"workload": "the command's arguments", "resume_args": "--resume-args",
          "save_path": "--save-path"}


def _placed(word: str, field: str, task: dict[str, str] | None) -> str:
    """One word with its placeholders put in for the task (None: a job that is no
    command's sweep, where none is replaced: refused), escaped ones as their letters."""
    out = []
    for kind, piece in pieces(word):
        text = piece
        if kind == NEWEST:
            if field != "resume_args":
                raise ConfigError(field, f"{word!r}: {OPEN}GLOB}} is replaced only in "
                                  f"--resume-args (e.g. {EXAMPLE}); in {_WHERE[field]} the "
                                  f"program would get its letters (write {{{OPEN}...}}}} "
                                  "for those)")
            glob = "".join(_into_glob(word, part, task) if k == MARKER else part
                           for k, part in pieces(text))
            out.append(OPEN + glob + "}")
            continue
        if kind == MARKER:
            if task is None:
                raise ConfigError(field, f"{word!r}: {{{text}}} is replaced only in the "
                                  "tasks of a command's sweep (--sweep NAME=V1,V2,... or "
                                  "--sweep-seeds), in the command's arguments, --resume-args "
                                  "and --save-path; here the program would get its letters "
                                  f"(write {{{{{text}}}}} for those)")
            text = task[piece]
        if field == "resume_args" and "{newest" in text.lower():
            how = "no escape there" if kind == TEXT else \
                f"leave {{{piece}}} out there; a task finds it in TRAIN_SWEEP_VALUE"
            raise ConfigError("resume_args" if kind == TEXT else "sweep",
                              f"{word!r} would put {text!r} into --resume-args, where the "
                              f"chain reads every {OPEN}...}} as a placeholder, never as "
                              f"plain text ({how})")
        out.append(text)
    return "".join(out)


def _into_glob(word: str, marker: str, task: dict[str, str] | None) -> str:
    """A marker's text put into a {newest:GLOB}: plain text there, or refused."""
    if task is None:
        raise ConfigError("resume_args", f"{word!r}: {{{marker}}} is replaced only in the "
                          "tasks of a command's sweep (--sweep or --sweep-seeds)")
    text = task[marker]
    if _GLOB_SPECIAL.search(text):
        field = "sweep" if marker == "value" else "out"
        raise ConfigError(field, f"{word!r}: the task's {marker.replace('_', ' ')} {text!r} "
                          "holds a character a {newest:GLOB} reads as a pattern or its end "
                          "(* ? [ ] { } \\): it cannot go into one as plain text")
    return text


def placed(workload: Sequence[str], resume_args: str | None, save_path: Sequence[str],
           task: dict[str, str] | None = None) -> dict[str, Any]:
    """The job spec's changes with every placeholder put in: a task's markers (`task`:
    value, index, task_dir) as plain text, one argument staying one argument (--resume-args
    is split as a shell would first); escaped placeholders become their letters."""
    changes: dict[str, Any] = {
        "workload": tuple(_placed(a, "workload", task) for a in workload),
        "save_path": tuple(_placed(p, "save_path", task) for p in save_path)}
    if resume_args is not None:
        words = shlex.split(resume_args)
        done = [_placed(w, "resume_args", task) for w in words]
        changes["resume_args"] = resume_args if done == words else shlex.join(done)
    return changes


def task_changes(spec: JobSpec, index: int, value: str, task_dir: str) -> dict[str, Any]:
    """The job spec's changes for one task of a command sweep: each marker replaced
    (--chdir {task_dir}: each task runs in its own folder)."""
    task = {"value": value, "index": str(index), "task_dir": task_dir}
    changes = placed(spec.workload, spec.resume_args, spec.save_path, task)
    changes["chdir"] = None if spec.chdir is None else _placed(spec.chdir, "chdir", task)
    return changes


def check_command_sweep(spec: JobSpec) -> None:
    """Refuse, in a command's sweep: `$TRAIN_SWEEP_VALUE` (or the index, or TRAIN_RUN_DIR)
    in an argument of a program no shell starts (the program gets the letters); where
    each task writes to its own folder, a {newest:GLOB} that names none (every task would
    look in the same place, where none of them saves); a --save-path every task would
    share (each would take another's save for its own and resume from it)."""
    command = spec.workload
    # `bash -c '...'` (or sh, zsh, ...): a shell expands what it is given
    shell = command and _SHELLS.fullmatch(os.path.basename(command[0])) and "-c" in command
    for arg in () if shell else command:
        found = _SHELL_VARIABLE.search(arg)
        if found is None:
            continue
        marker = {"SWEEP_VALUE": VALUE, "SWEEP_INDEX": INDEX}.get(found.group(2), TASK_DIR)
        raise ConfigError("workload", f"{arg!r} reaches the program as written (no shell expands "
                          f"the command's arguments): write {marker} where the task's "
                          f"{found.group(2).lower().replace('_', ' ')} goes, e.g. "
                          f"{arg.replace(found.group(0), marker)!r}; each task gets its "
                          "own, as plain text")
    own = next((a for a in command if TASK_DIR in a), None)
    # --chdir {task_dir}: each task runs in its own folder, a relative path is its own
    own_folder = spec.chdir is not None and _MARKER.search(spec.chdir) is not None
    for glob in patterns(shlex.split(spec.resume_args)) if spec.resume_args else []:
        if own is not None and not _MARKER.search(glob) and \
                (os.path.isabs(glob) or not own_folder):
            fix = glob if os.path.isabs(glob) else f"{TASK_DIR}/{glob}"
            raise ConfigError("resume_args", f"{OPEN}{glob}}} is looked for in the same "
                              f"place for every task, while each task writes to its own "
                              f"folder ({own!r}): it can match no task's saves; write "
                              f"{OPEN}{fix}}} (with {TASK_DIR} where the task saves)")
    for item in spec.save_path:
        if _MARKER.search(item) is None and (os.path.isabs(item) or not own_folder):
            raise ConfigError("save_path", f"{item!r} is the same path for every task of "
                              "the sweep: each would take another's saves for its own and "
                              "resume from them. Give each task its own: --chdir {task_dir} "
                              "(each task runs in its own folder; relative save paths are "
                              "from there), or a save path with {task_dir} (or {value}) in "
                              "it, where the task's program saves")


def check_unmarked(spec: JobSpec, chdir_placed: bool = False) -> None:
    """Refuse a placeholder where none is replaced (--env, --bind, --out, --sbatch-extra,
    every field but the command's arguments, --resume-args, --save-path and, where
    `chdir_placed`, --chdir): the program, or Slurm, would get its letters."""
    placed_here = {"workload", "resume_args", "save_path", "sweep",
                   *(["chdir"] if chdir_placed else [])}
    for item_field in dataclasses.fields(spec):
        given = getattr(spec, item_field.name)
        items = () if item_field.name in placed_here else \
            given if isinstance(given, tuple) else (given,)
        for item in (i for i in items if isinstance(i, str)):
            marker = _MARKER.search(item)
            if marker is not None:
                raise ConfigError(item_field.name, f"{item!r}: {marker.group(0)} is "
                                  "replaced only in the tasks of a command's sweep (-e "
                                  "command with --sweep or --sweep-seeds), in the command's "
                                  "arguments, --resume-args, --save-path and --chdir; the "
                                  "program finds its task's value, index and folder in "
                                  "TRAIN_SWEEP_VALUE, TRAIN_SWEEP_INDEX and TRAIN_RUN_DIR")
            if OPEN in item:
                raise ConfigError(item_field.name, f"{item!r}: {OPEN}GLOB}} is replaced "
                                  f"only in --resume-args (e.g. {EXAMPLE}); here it would "
                                  "be its letters")


def _shared_outputs(command: Sequence[str], own_folder: bool) -> list[str]:
    """The output options of the command whose value names no task's own folder (a
    relative one is the task's own where each task runs in its own folder)."""
    out = []
    for i, arg in enumerate(command):
        name, eq, given = arg.partition("=")
        if not _OUTPUT_OPTION.fullmatch(name.lower()):
            continue
        value = given if eq else (command[i + 1] if i + 1 < len(command) else "")
        if value and not value.startswith("-") and TASK_DIR not in value \
                and "TRAIN_RUN_DIR" not in value and (os.path.isabs(value) or not own_folder):
            out.append(f"{name} {value}")
    return out


def sweep_notes(command: Sequence[str], resume_args: str | None,
                folder: str | None) -> list[str]:
    """Warnings for a command sweep: tasks that all run the same arguments, output folders
    every task shares, and tasks that all run in one folder with nothing of their own."""
    notes = []
    words = [*command, resume_args or ""]
    own_folders = any(TASK_DIR in w for w in [*words, folder or ""])
    if not own_folders and not _MARKER.search(folder or "") and \
            b"TRAIN_RUN_DIR" not in script_text(command, folder):
        where = os.path.abspath(folder or ".")
        notes.append(f"the tasks of this sweep all run in {where} (and no {{task_dir}} or "
                     "TRAIN_RUN_DIR gives them a folder of their own): a program that saves "
                     "where it runs (a snapshot.pt, checkpoints/) would resume from "
                     "another task's saves. --chdir {task_dir} runs each task in its own "
                     "folder")
    if not any(m in w for w in words for m in (VALUE, INDEX, "TRAIN_SWEEP_")) and \
            b"TRAIN_SWEEP_" not in script_text(command, folder):
        # {task_dir} alone makes the commands differ, not what they train
        alike = ("the tasks' commands differ only in {task_dir}, so each trains the same "
                 "thing" if own_folders else "every task runs the same command")
        notes.append("no task of this sweep gets its own value (no {value} or {index} "
                     "among its arguments, and no TRAIN_SWEEP_VALUE in its script): "
                     f"{alike}; write {{value}} where the task's value goes, e.g. -- python "
                     "train.py --lr {value}, or read TRAIN_SWEEP_VALUE in the program")
    own_folder = _MARKER.search(folder or "") is not None
    for option in _shared_outputs(command, own_folder):
        notes.append(f"every task of this sweep writes to {option}"
                     + ("" if own_folder else " (the tasks run in the same folder)")
                     + f": give each its own with {{task_dir}}, e.g. {option.split()[0]} "
                     "{task_dir}/out")
    return notes


def single_job(spec: JobSpec) -> JobSpec:
    """A job that is no sweep, its placeholders checked: a sweep's marker or a
    {newest:GLOB} where nothing replaces it refused, escaped ones their letters."""
    check_unmarked(spec)
    return dataclasses.replace(spec, **placed(spec.workload, spec.resume_args,
                                              spec.save_path))
