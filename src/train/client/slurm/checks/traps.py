"""Traps a `--entry command` job walks into after the queue wait, said at render and submit
(warnings: the login node reads only the script it can find, and guesses from its text):

- a stop signal the program has no handler for: it dies of it (138 for USR1) at the margin;
- a chain whose program saves nowhere the chain looks (no --save-path, nothing written to
  TRAIN_RUN_DIR): it ends after chunk 1, "stopped before any save";
- --resume-args or --stop-mode kill on a job of one chunk (a command is one chunk unless
  --max-chunks or --total-time asks for a chain): nothing would ever resume;
- a --save-path in the container under no bind and absent on the host: what the program
  saves there stays in its container, unseen by the chain.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from train.client.programs import SCRIPT_LIMIT, script_of
from train.client.slurm.jobitems import parse_bind
from train.client.slurm.resolve import ResolvedJob

FOLDER_LIMIT = 50  # .py files beside the script that are read for a handler
_LIGHTNING = re.compile(rb"^[ \t]*(?:import|from)[ \t]+(?:lightning|pytorch_lightning)\b",
                        re.MULTILINE)
# where a program's saves are seen by the chain without --save-path
_SAVES_SEEN = (b"TRAIN_RUN_DIR", b"TRAIN_PROGRESS_FILE", b"PL_TRAINER_DEFAULT_ROOT_DIR")


def _texts(script: Path) -> list[bytes]:
    """The script's text and its neighbours' (.py files of its folder, a bounded few)."""
    out = []
    try:
        neighbours = sorted(p for p in script.parent.glob("*.py") if p != script)
    except OSError:
        neighbours = []
    for path in [script, *neighbours[:FOLDER_LIMIT]]:
        try:
            if path.is_file():
                with open(path, "rb") as fh:
                    out.append(fh.read(SCRIPT_LIMIT))
        except OSError:
            continue
    return out


def _handles(texts: list[bytes], signal: str) -> bool:
    """Whether any text sets a handler for SIG<signal>, or leaves it to Lightning (whose
    SLURM support saves and requeues on USR1)."""
    for text in texts:
        if f"SIG{signal}".encode() in text or b"TRAIN_STOP_SIGNAL" in text \
                or b"SLURMEnvironment" in text:
            return True
        if signal == "USR1" and _LIGHTNING.search(text):
            return True
    return False


def trap_notes(job: ResolvedJob) -> list[str]:
    """The warnings for a command job's program (none for other entries)."""
    spec = job.spec
    if spec.entry != "command":
        return []
    notes = []
    script = script_of(spec.workload, spec.chdir)
    texts = _texts(script) if script is not None else []
    if texts and spec.stop_mode == "signal" and job.stop in ("USR1", "TERM") \
            and not _handles(texts, job.stop):
        code = 128 + (10 if job.stop == "USR1" else 15)
        notes.append(f"--stop-signal {job.stop}: {script} (and the .py files beside it) set "
                     f"no handler for SIG{job.stop}, so the program dies of it (exit {code}) "
                     f"{job.margin} s before the walltime, after the queue wait. Add one that "
                     f"saves and exits 0 (signal.signal(signal.SIG{job.stop}, handler)), or "
                     "give --stop-mode kill (for a program that saves on its own), or "
                     "--stop-signal none (one chunk)")
    shown = " ".join(spec.workload)
    if job.chunks > 1 and not spec.save_path and job.run_dir not in shown \
            and "TRAIN_RUN_DIR" not in shown \
            and not any(w in t for t in texts for w in _SAVES_SEEN) \
            and not any(_LIGHTNING.search(t) for t in texts):
        notes.append(f"a chain of up to {job.chunks} chunks goes on only after a stop that "
                     "saved something (under the run folder TRAIN_RUN_DIR, or a --save-path), "
                     "and nothing says where this program saves: it would end after chunk 1 "
                     "'stopped before any save'. Give --save-path DIR (the file or folder it "
                     "saves to), or save under $TRAIN_RUN_DIR")
    if job.chunks == 1 and (spec.resume_args is not None or spec.stop_mode == "kill"):
        given = "--resume-args" if spec.resume_args is not None else "--stop-mode kill"
        notes.append(f"{given} is for a chain, and this job is one chunk (a command is, "
                     "unless asked): give --total-time D-HH:MM:SS (chunks of --time until "
                     "then) or --max-chunks N")
    notes += [f"--save-path {given}: the {spec.runtime} container shares no folder with the "
              f"batch host there (none of its binds holds it, and the host has no {given}): "
              "what the program saves there stays in its container, and the chain never "
              f"sees it; bind a folder there (--bind SRC:{given})"
              for given in _unshared_saves(job)]
    return notes


def _unshared_saves(job: ResolvedJob) -> list[str]:
    """The container job's absolute --save-path items under no bind's destination that
    the batch host does not have either."""
    if job.spec.runtime == "none":
        return []
    dests = [Path(parse_bind(b).dst) for b in job.binds]
    out = []
    for given in job.spec.save_path:
        path = Path(os.path.normpath(given))
        if path.is_absolute() and not any(d == path or d in path.parents for d in dests) \
                and not os.path.lexists(path):
            out.append(given)
    return out
