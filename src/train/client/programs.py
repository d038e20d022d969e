"""What the login node can tell about a user's program before submitting it (`--entry
command`): whether its script imports Lightning (which wants one task per GPU from Slurm),
whether its folder holds another run's Lightning checkpoints, and what a program given in
place of a workload (or misspelt) was meant as. Only files the login node can read are
looked at; anything else is left to the node.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from train.batch.saves import read_small
from train.client.slurm.jobspec import DEFAULT_PYTHON
from train.common.errors import ConfigError
from train.workloads.config import WORKLOADS

SCRIPT_LIMIT = 4 * 2**20  # a script is read up to this size
LIGHTNING = re.compile(rb"^[ \t]*(?:import|from)[ \t]+(?:lightning|pytorch_lightning)\b",
                        re.MULTILINE)


def script_of(command: Sequence[str], folder: str | os.PathLike[str] | None = None
              ) -> Path | None:
    """The Python file the command runs (the first `.py` argument, or `-m MODULE`'s) under
    `folder` (default: the current one), where the login node can read it."""
    base = Path(folder) if folder is not None else Path.cwd()
    args = list(command)
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            parts = Path(*args[i + 1].split("."))
            candidates = [base / parts.with_suffix(".py"), base / parts / "__main__.py"]
        elif arg.endswith(".py"):
            candidates = [base / arg]
        else:
            continue
        for path in candidates:
            try:
                if path.is_file():
                    return path
            except OSError:
                continue
        return None  # the program's own file, but not here: left to the node
    return None


def script_text(command: Sequence[str], folder: str | os.PathLike[str] | None = None
                ) -> bytes:
    """The start (SCRIPT_LIMIT) of the command's script; empty where it cannot be read."""
    path = script_of(command, folder)
    return (read_small(str(path), SCRIPT_LIMIT) if path is not None else None) or b""


def imports_lightning(command: Sequence[str], folder: str | os.PathLike[str] | None = None
                      ) -> bool:
    """Whether the command's script imports Lightning (`lightning` or
    `pytorch_lightning`) at the start of a line."""
    return LIGHTNING.search(script_text(command, folder)) is not None


def submit_notes(entry: str, command: Sequence[str], launch: str, run_dir: str,
                 folder: str | os.PathLike[str] | None = None) -> list[str]:
    """Warnings for `train submit` about a command job's program (nothing is refused)."""
    if entry != "command":
        return []
    notes = []
    base = Path(folder) if folder is not None else Path.cwd()
    try:  # Lightning's SLURM checkpoints
        found = sorted(p.name for p in base.glob("hpc_ckpt_*.ckpt"))
    except OSError:
        found = []
    if found and Path(os.path.abspath(run_dir)) != Path(os.path.abspath(base)):
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        notes.append(f"{base} holds Lightning checkpoints of another run ({shown}): this "
                     f"job's default_root_dir is its run folder {run_dir} "
                     "(PL_TRAINER_DEFAULT_ROOT_DIR), so it does not restore them; a script "
                     f"that sets default_root_dir to {base} would")
    if launch == "torchrun" and imports_lightning(command, base):
        notes.append("the script imports Lightning, and --launch torchrun runs it under "
                     "torch's launcher: Lightning then installs no handler for the stop "
                     "signal (its SLURM support is off). --launch tasks, the default for "
                     "Lightning scripts, is what it expects")
    return notes


# the programs an image is expected to have (python, a shell, torch's and Hugging Face's
# launchers): any other is worth a word where the login node cannot look for it
PROGRAM_NAME = re.compile(r"python[0-9.]*|(ba|z|da)?sh|torchrun|accelerate(-launch)?|deepspeed")
_KNOWN_PROGRAMS = ("python", "python3", "bash", "torchrun", "accelerate", "accelerate-launch",
                   "deepspeed")


def command_as_run(command: Sequence[str], runtime: str, python: str) -> list[str]:
    """The command as the nodes run it: verbatim, except that under runtime none with a
    --python of the user's a bare `python` or `python3` first is that Python, the one
    submit checked (not whichever the nodes' PATH finds first, which may lack torch)."""
    if runtime == "none" and python != DEFAULT_PYTHON and command \
            and command[0] in ("python", "python3"):
        return [python, *command[1:]]
    return list(command)


def interpreter_note(entry: str, command: Sequence[str], runtime: str, python: str
                     ) -> str | None:
    """What submit says of the command's interpreter under runtime none with a --python of
    the user's: a note where it runs as that Python, a warning where a versioned one
    (python3.12) runs from the nodes' PATH instead; None otherwise."""
    if entry != "command" or not command:
        return None
    first = command[0]
    if command_as_run(command, runtime, python)[0] != first:
        return (f"note: runtime none: the command's {first} runs as --python {python}, the "
                f"interpreter checked here (not the first {first} on the nodes' PATH)")
    if runtime == "none" and python not in (DEFAULT_PYTHON, first) and \
            first.startswith("python") and PROGRAM_NAME.fullmatch(first):
        return (f"warning: the command runs {first} from the nodes' PATH, not --python "
                f"{python}, which was checked here: write `python` (it runs as --python) or "
                "give that Python as --python")
    return None


def looks_like_program(word: str) -> bool:
    """Whether a word given as a `train run` workload names a program instead: python, a
    shell, a launcher, a .py or .sh file, or a path to an executable file."""
    name = os.path.basename(word)
    if name.endswith((".py", ".sh")) or PROGRAM_NAME.fullmatch(name):
        return True
    try:
        return os.sep in word and os.path.isfile(word) and os.access(word, os.X_OK)
    except (OSError, ValueError):
        return False


def implied_entry(typed: Sequence[str]) -> str:
    """The entry of a job that names none (by flag, job file or defaults), from what follows
    `--`: train for a `train run` workload, its options or nothing; any other first word is
    a program (python, uv, conda, env, time, julia, a path, a typo), run as `-e command`
    would and checked as one at submit (train.client.slurm.checks.files). A bare .py stays
    train, refused with the fix (`python FILE`: its argv is not ours to rewrite); a word
    close to a workload's name (dmeo) is refused naming both ways."""
    if not typed or typed[0] in WORKLOADS or typed[0].startswith("-") \
            or typed[0].endswith(".py"):
        return "train"
    word = typed[0]
    close = difflib.get_close_matches(word, WORKLOADS, n=1, cutoff=0.7)
    if close and os.sep not in word:
        raise ConfigError("workload", f"{word!r} is no `train run` workload (did you mean "
                          f"{close[0]}? the workloads: {', '.join(WORKLOADS)}); a program of "
                          f"that name runs with -e command -- {shlex.join(typed)}")
    return "command"


def program_slip(name: str) -> str:
    """What a program name that cannot be found may be a slip of, as a parenthesis for an
    error or a note ('' for none): a known program's name misspelt (pyhton), or a shell's
    variable assignment (X=1 python ...), which the job does not run through a shell."""
    if name in WORKLOADS:  # (--entry command from a job file or the defaults file)
        return (f" ({name} is a `train run` workload, and this job is --entry command: give "
                "--entry train)")
    if name.strip() != name:
        return f" (spaces around the name: {name.strip()!r}?)"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", name):
        return (f" ({name} is a shell's variable assignment, and the command runs without a "
                f"shell: give --env {name}, or -- env {name} PROGRAM ...)")
    close = difflib.get_close_matches(name, _KNOWN_PROGRAMS, n=1, cutoff=0.7)
    return f" (did you mean {close[0]}?)" if close and close[0] != name else ""


def command_hint(typed: Sequence[str]) -> str | None:
    """The error for a program given where a `train run` workload goes (the entry left
    out): what to type instead, or None where `typed` does not look like one."""
    if not typed or typed[0] in WORKLOADS or not looks_like_program(typed[0]):
        return None
    run = ["python", *typed] if typed[0].endswith(".py") else list(typed)
    return (f"{typed[0]!r} is a program, not a `train run` workload ({', '.join(WORKLOADS)}): "
            f"to run it, give --entry command: -e command -- {shlex.join(run)}")
