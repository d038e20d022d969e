"""The scontrol stand-in: inside the step, a program's `scontrol requeue` (Lightning's SLURM
plugin runs it on the walltime signal, after saving its checkpoint) must not requeue the job
from inside: the chain goes on by itself. The stand-in asks the batch shell to end the step
(TERM to its tasks: Lightning then exits 0) by writing the file TRAIN_STOP_REQUEST names;
the next chunk resumes from the checkpoint. Anything else goes to the real scontrol."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import MutableMapping
from pathlib import Path

log = logging.getLogger("train.node.launch")

SCONTROL_SHIM = """#!/bin/sh
[ "${1:-}" != --train-shim-probe ] || exit 0
if [ -n "${TRAIN_SHIM_ACTIVE:-}" ]; then  # found itself again: no real scontrol here
    echo "train: no scontrol on PATH besides train's stand-in" >&2
    exit 127
fi
if [ "${1:-}" = requeue ]; then
    # (a temporary name of this process's own: every task of the step may ask at once)
    tmp="${TRAIN_STOP_REQUEST:-}.tmp.${SLURM_PROCID:-0}.$$"
    if [ -z "${TRAIN_STOP_REQUEST:-}" ] || ! { echo "requeue ${2:-}" > "$tmp" && \
            mv "$tmp" "$TRAIN_STOP_REQUEST"; }; then
        echo "train: scontrol requeue is not run inside a job step, and the request to end" \
            "this chunk could not be written (${TRAIN_STOP_REQUEST:-no TRAIN_STOP_REQUEST})" >&2
        exit 1
    fi
    echo "train: the program asked to requeue job ${2:-}: this chunk ends now (its" \
        "checkpoint is written) and the chain's next chunk continues" >&2
    exit 0
fi
self_dir=$(cd "$(dirname "$0")" && pwd -P)
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | while IFS= read -r d; do
    [ "$(cd "$d" 2>/dev/null && pwd -P)" = "$self_dir" ] || printf '%s\n' "$d"
done | paste -sd: -)
TRAIN_SHIM_ACTIVE=1
export PATH TRAIN_SHIM_ACTIVE
exec scontrol "$@"
"""


SHIM_FOLDER = ".scontrol-shim"


def install_scontrol_shim(env: MutableMapping[str, str]) -> Path | None:
    """Put the stand-in first on PATH for the program (and its children). It lives in the
    run folder (one per run, rewritten in place by each launch: nothing is left in /tmp,
    whose noexec mounts at some sites would also make the stand-in be skipped for the real
    scontrol); a run folder where it cannot execute falls back to a fresh folder under
    $TMPDIR, returned so that a launch that does not exec can remove it. Returns the
    folder, or None where the program keeps the real scontrol."""
    import subprocess
    import tempfile

    run_dir = env.get("TRAIN_RUN_DIR")
    places: list[Path | None] = [Path(run_dir) / SHIM_FOLDER] if run_dir else []
    places.append(None)
    for place in places:
        try:
            if place is None:
                folder = Path(tempfile.mkdtemp(prefix=".train-shim-",
                                               dir=os.environ.get("TMPDIR")))
            else:
                folder = place
                folder.mkdir(exist_ok=True)
            shim = folder / "scontrol"
            _write_shim(shim)
            subprocess.run([str(shim), "--train-shim-probe"], check=True, timeout=30,
                           capture_output=True)
        except (OSError, subprocess.SubprocessError):
            if place is None:
                with contextlib.suppress(NameError, OSError):
                    remove_shim(folder)
            continue
        path = env.get("PATH") or os.defpath
        env["PATH"] = f"{folder}{os.pathsep}{path}"
        return folder
    log.warning("no place to run the scontrol stand-in: a program that runs `scontrol "
                "requeue` (Lightning's SLURM support) would requeue the job from inside")
    return None


def _write_shim(shim: Path) -> None:
    """Write the stand-in unless it is there already: a new file renamed over the old one
    (tasks on other nodes may be running it), with an old modification time, so that it
    never looks like something the program saved during the chunk."""
    with contextlib.suppress(OSError):
        if shim.read_text(encoding="utf-8") == SCONTROL_SHIM and os.access(shim, os.X_OK):
            return
    tmp = shim.with_name(f".scontrol.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        tmp.write_text(SCONTROL_SHIM, encoding="utf-8")
        tmp.chmod(0o755)
        os.utime(tmp, (0, 0))
        os.replace(tmp, shim)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def remove_shim(folder: Path | None) -> None:
    """A stand-in folder of this launch's own under $TMPDIR (never the run folder's)."""
    if folder is None or folder.name == SHIM_FOLDER:
        return
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
