"""Shared fixtures; integration tiers skip with a reason that says how to enable them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

# Settings that make a demo run take seconds: small screen, short episodes, early learning.
TINY: dict[str, Any] = {
    "device": "cpu",  # bit-exact resume is a CPU promise; GPU runs have their own tests
    "res": 8,
    "episode_steps": 16,
    "batch_size": 8,
    "learning_starts": 32,
    "replay_size": 400,
    "target_update": 20,
    "eps_decay_steps": 200,
    "eval_episodes": 2,
    "checkpoint_every": 2,
    "log_every": 0.5,
}


def tiny_flags(**overrides: Any) -> list[str]:
    values = {**TINY, **overrides}
    argv: list[str] = []
    for key, value in values.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    return argv


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "train", *args]


def run_cli(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 900,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`train ARGS`, its output captured. The timeout only guards against a hang: a demo
    training run of a few hundred episodes beside CI's other runs on two busy cores once
    took over 180 s, so it is far above any run's work."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(train_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=cwd, check=False)


_GROUPS: list[subprocess.Popen[str]] = []


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def spawn_group(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
    """Start argv as the leader of a new process group (signals can go to the whole group,
    as Slurm sends them to every process of a job); the group is killed when the test ends,
    so a failing test leaves nothing running. It starts with the default action for every
    signal, as a Slurm task does: a test run started in the background (nohup, `&`) has
    SIGINT ignored, and a shell cannot trap a signal ignored when it starts."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_default_signals,
                            **kwargs)
    _GROUPS.append(proc)
    return proc


# sends signal SIG to PID as fast as it can until PID is gone (at most 10**6 times), and
# says "on" after the first: Slurm's copy of a signal that reaches a process while it ends
LATE_SIGNALS = ("import os, sys\n"
                "pid, sig = int(sys.argv[1]), int(sys.argv[2])\n"
                "for i in range(10 ** 6):\n"
                "    try:\n        os.kill(pid, sig)\n"
                "    except ProcessLookupError:\n        break\n"
                "    if i == 0:\n        print('on', flush=True)\n")


def signals_while_ending(target: str, sig: int) -> str:
    """Python lines that start LATE_SIGNALS against the pid `target` (an expression) and
    go on once it has sent its first signal."""
    return ("import os, subprocess, sys\n"
            f"late = subprocess.Popen([sys.executable, '-c', {LATE_SIGNALS!r}, str({target}), "
            f"'{int(sig)}'], stdout=subprocess.PIPE, text=True)\n"
            "late.stdout.readline()\n")


@pytest.fixture(autouse=True)
def _no_process_group_left() -> Iterator[None]:
    yield
    while _GROUPS:
        proc = _GROUPS.pop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(autouse=True)
def _own_defaults(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test starts with no job defaults: a developer's own ~/.config/train/
    defaults.yaml must not change what tests render. (A user at a site has exactly one
    such file, or none; tests that need one write it here.)"""
    path = tmp_path_factory.mktemp("defaults") / "defaults.yaml"
    monkeypatch.setenv("TRAIN_DEFAULTS", str(path))
    yield path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA (torch sees none); "
                                "run on a GPU node: nox -s tests -- -m gpu")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
