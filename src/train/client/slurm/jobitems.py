"""The job's list options item by item: --env, --bind, --sbatch-extra and --srun-extra,
each checked where the job spec takes it (a bad one refused with the field's name before
anything is resolved, written or submitted). Light: the defaults file reads binds with it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from train.common.errors import ConfigError
from train.common.secrets.commands import redact_text
from train.common.secrets.names import is_secret_name

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: no trailing newline
# names a job may pass through but not set: the batch shell, Slurm or the launcher own them.
# PYTHONPATH is the program's to set (a fork put on the path, as the field notes' NAVSIM
# fork needed): the batch shell runs no Python, and the images set none of their own.
# PYTHONHOME stays: a wrong one stops every Python, `train launch` included.
RESERVED_ENV = {"PATH", "BASH_ENV", "ENV", "HOME", "SHELL", "IFS", "RANK", "LOCAL_RANK",
                "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                "CUDA_VISIBLE_DEVICES", "PYTHONHOME"}
RESERVED_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "TRAIN_", "LD_",
                         "APPTAINER", "SINGULARITY")
# Options the renderer writes itself: an extra option may not set them (the field to use).
SBATCH_OWNED = {
    "--nodes": "nodes", "-N": "nodes", "--ntasks": "ntasks_per_node", "-n": "ntasks_per_node",
    "--ntasks-per-node": "ntasks_per_node", "--gres": "gpus_per_node",
    "--gpus": "gpus_per_node", "-G": "gpus_per_node", "--gpus-per-node": "gpus_per_node",
    "--gpus-per-task": "gpus_per_node", "--time": "time", "-t": "time",
    "--time-min": "time_min",
    "--signal": "stop_signal and signal_margin", "--output": "out", "-o": "out",
    "--error": "out", "-e": "out", "--job-name": "name", "-J": "name",
    "--account": "account", "-A": "account", "--partition": "partition", "-p": "partition",
    "--qos": "qos", "-q": "qos", "--constraint": "constraint", "-C": "constraint",
    "--mem": "mem", "--mem-per-cpu": "mem", "--mem-per-gpu": "mem",
    "--cpus-per-task": "cpus_per_task", "-c": "cpus_per_task",
    "--requeue": "requeue", "--no-requeue": "requeue", "--open-mode": "(none: the chain "
    "appends to its logs)", "--kill-on-invalid-dep": "(none: the chain needs it)",
    "--dependency": "(none: the chain sets it)", "-d": "(none: the chain sets it)",
    "--array": "(none)", "-a": "(none)", "--chdir": "out", "-D": "out",
    "--export": "env", "--export-file": "env", "--wrap": "(nothing: the job is the script)",
    "--hold": "(nothing: every chunk after the first would stay held)",
    "--test-only": "(nothing: train render is the dry run)",
    "--clusters": "cluster (the chain's own sbatch/scancel work on one cluster)",
    "--cpus-per-gpu": "cpus_per_task", "--ntasks-per-gpu": "ntasks_per_node",
    "--batch": "(nothing)",
}
SRUN_OWNED = {
    **{k: v for k, v in SBATCH_OWNED.items() if k not in ("--output", "-o", "--error", "-e")},
    "--kill-on-bad-exit": "(nothing: a failed rank ends the step)",
    "--jobid": "(nothing: the step runs in its own job)",
    "--multi-prog": "entry command (one program for every task)",
}


def check_env_item(item: str) -> tuple[str, str | None]:
    """`NAME` (passed through) or `NAME=VALUE` -> (name, value or None)."""
    name, sep, value = item.partition("=")
    if not ENV_NAME_RE.fullmatch(name):
        raise ConfigError("env", f"{name!r} is not a variable name (letters, digits and "
                          f"'_', not starting with a digit), in {item!r}")
    if "\0" in value:
        raise ConfigError("env", f"the value of {name} holds a NUL byte")
    if not sep and name.startswith(("APPTAINER", "SINGULARITY")):
        raise ConfigError("env", f"{name}: the submitting shell's Apptainer settings are "
                          "dropped by an apptainer job, never passed on: give binds with "
                          "--bind, and the program's variables as --env NAME or NAME=VALUE")
    if sep and (name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)):
        raise ConfigError("env", f"{name} is set by Slurm, the job or the launcher (the batch "
                          "shell depends on it); it cannot be given a value here")
    # by name: API_KEYS, PGPASSWORD, MYSQL_PWD, GITHUB_PAT, *_PASSPHRASE, *_PRIVATE_KEY;
    # by value: a password in a URL (DATABASE_URL=postgres://u:p@h/db), token=...,
    # "--password X" in a command line, a JWT or a well-known token format
    if sep and (is_secret_name(name) or redact_text(value) != value):
        why = ("its name" if is_secret_name(name) else "its value holds a credential: "
               "a URL's user:password@, token=..., --password X")
        raise ConfigError("env", f"{name} looks like a secret ({why}): a value given here "
                          f"is written into the job script; pass it through by name "
                          f"instead (--env {name} exports it from where you submit; set "
                          f"it there)")
    return name, (value if sep else None)


@dataclass(frozen=True)
class Bind:
    src: str
    dst: str
    read_only: bool = False

    @property
    def spec(self) -> str:
        """SRC[:DST][:ro], the form apptainer --bind and docker -v both take."""
        if self.src == self.dst and not self.read_only:
            return self.src
        return f"{self.src}:{self.dst}" + (":ro" if self.read_only else "")


def parse_bind(item: str) -> Bind:
    """SRC[:DST[:ro|rw]]; SRC is made absolute from the working directory."""
    parts = item.split(":")
    if len(parts) > 3 or not parts[0]:
        raise ConfigError("bind", f"{item!r} is not SRC, SRC:DST or SRC:DST:ro")
    if any(c in item for c in "\n\0,"):
        raise ConfigError("bind", f"{item!r}: a path with a newline, NUL or ',' cannot be "
                          "bound (the runtimes split on ',')")
    src = os.path.abspath(parts[0])
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    if not dst.startswith("/"):
        raise ConfigError("bind", f"{item!r}: the destination {dst!r} must be an absolute "
                          "path (and a path with ':' in it cannot be bound)")
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise ConfigError("bind", f"{item!r}: the mode must be ro or rw, got {mode!r}")
    # (normpath keeps a leading '//', which the runtimes read as '/': //proc is /proc)
    return Bind(src=src, dst="/" + os.path.normpath(dst).lstrip("/"), read_only=mode == "ro")


def check_extra_option(item: str, field_name: str, owned: dict[str, str]) -> None:
    """One option per item, `--name=value`, `--flag` or `-xVALUE`; none the job sets."""
    if not item.startswith("--") or item == "--":
        raise ConfigError(field_name, f"{item!r}: give one long option per item, e.g. "
                          "--reservation=NAME (short and bundled letters are not taken)")
    if any(c in item for c in "\n\r\0"):
        raise ConfigError(field_name, f"{item!r} holds a line break or NUL")
    key = item.split("=", 1)[0]
    if " " in key or len(key) < 4:
        raise ConfigError(field_name, f"{item!r}: give the value with '=' "
                          f"({key.split()[0]}=VALUE), one option per item")
    # Slurm takes any unambiguous prefix of a long option: so are they checked here
    for name, use in owned.items():
        if name.startswith("--") and name.startswith(key):
            how = use if use.startswith("(") else f"(use {use} instead)"
            raise ConfigError(field_name, f"{key} ({name}) is set by the job itself {how}")

