"""The project's exception types and exit codes (documented in docs/demo.md and `train run
--help`); train.node.nodeentry.reported alone maps them to messages and exit codes."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_RESOURCE = 3


class TrainError(Exception):
    exit_code = EXIT_FAILURE


class UsageError(TrainError):
    """Bad input from the user; nothing has been written or submitted."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A config value is wrong; the message names the field and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ResourceError(TrainError):
    """Something outside the program is missing or too small (GPU memory, the game binary)."""

    exit_code = EXIT_RESOURCE


DISTRIBUTION = "train-slurm-apptainer"  # pyproject.toml's name; PyPI's `train` is another project


def install_hint(extra: str) -> str:
    """How to install an extra: from a checkout (there is no package index release)."""
    return (f"pip install './[{extra}]' in a checkout of this repository (the distribution "
            f"{DISTRIBUTION}; `pip install train` installs an unrelated project)")


# top-level modules of the `run` extra (pyproject.toml): torch, numpy, matplotlib,
# python-hostlist and nvidia-ml-py
RUNTIME_MODULES = frozenset({"torch", "numpy", "matplotlib", "hostlist", "pynvml"})


def runtime_missing(exc: ModuleNotFoundError) -> ResourceError | None:
    """The error for a module of the training runtime (the `run` extra) that is not
    installed, else None (Python names the first missing package, so a missing submodule
    of one installed stays unexpected)."""
    if exc.name not in RUNTIME_MODULES:
        return None
    return ResourceError(
        f"the training runtime is not installed here (no module named {exc.name!r}): "
        f"install it with {install_hint('run')}, or run the command inside the container "
        "image")


class PreallocationError(ResourceError):
    """The optimizer state and a full training batch do not fit on the device at start-up."""


class EnvironmentUnavailable(ResourceError):
    """The training environment (e.g. StarCraft II) cannot be started here."""


class CheckpointError(TrainError):
    """A checkpoint cannot be written, or none of the existing ones can be read."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, at most `limit` characters."""
    return (str(exc).strip().splitlines() or [""])[0][:limit]
