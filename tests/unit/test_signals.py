from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from train.batch.contract import SIGNAL_READY_VAR
from train.node.signals import StopController


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_budget_never_stops_by_itself() -> None:
    clock = FakeClock()
    stopper = StopController(None, clock)
    clock.now += 1e6
    assert not stopper.should_stop()


def test_budget_stops_before_an_episode_that_would_not_fit() -> None:
    clock = FakeClock()
    stopper = StopController(60.0, clock)
    clock.now += 40
    stopper.episode_finished(10.0)
    assert not stopper.should_stop()  # 40 + 12 < 60
    clock.now += 10
    stopper.episode_finished(10.0)
    assert stopper.should_stop()  # 50 + 12 >= 60
    assert stopper.reason is not None and "time budget" in stopper.reason


def test_episode_estimate_leans_on_slow_episodes() -> None:
    stopper = StopController(100.0, FakeClock())
    stopper.episode_finished(20.0)
    stopper.episode_finished(1.0)
    assert stopper._episode_seconds > 10


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM, signal.SIGINT])
def test_signals_request_a_clean_stop(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with StopController(None) as stopper:
        os.kill(os.getpid(), sig)
        assert stopper.should_stop()
        assert stopper.reason == f"received {sig.name}"
    assert signal.getsignal(sig) == before


def test_second_sigint_interrupts_at_once() -> None:
    with StopController(None) as stopper:
        os.kill(os.getpid(), signal.SIGINT)
        assert stopper.should_stop()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_signal_before_the_trainer_is_ready_is_kept() -> None:
    from train.node.signals import install_early_handlers

    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        install_early_handlers()
        os.kill(os.getpid(), signal.SIGUSR1)  # would kill an unprepared Python process
        with StopController(None) as stopper:
            assert stopper.should_stop()
            assert stopper.reason == "received SIGUSR1"
        with StopController(None) as stopper:  # consumed once
            assert not stopper.should_stop()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_late_walltime_signal_after_the_run_cannot_kill_the_process(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    # CPython resets Python-level handlers to SIG_DFL while it shuts down (SIG_IGN is left
    # alone), so a walltime USR1 in that window killed finished runs with exit 138: after the
    # run the disposition must be SIG_IGN, which a Python-level handler is not.
    code = (
        "import signal, sys\n"
        "from train.cli import main\n"
        f"rc = main(['run', '--out', {str(tmp_path / 'r')!r}, '--episodes', '1',"
        " '--res', '8', '--episode-steps', '4', '--batch-size', '2', '--learning-starts',"
        " '2', '--replay-size', '8', '--eval-episodes', '0', '--device', 'cpu'])\n"
        "assert rc == 0, rc\n"
        "assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN, "
        "signal.getsignal(signal.SIGUSR1)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_the_jobs_stop_signal_that_keeps_coming_after_the_training_is_no_death(
        tmp_path: Path, sig: int) -> None:
    """A run that stops at its deadline ends as the engine passes the stop on: with the
    stop signal TERM (`scancel --signal=TERM` to the step's tasks) a copy that came once the
    training had returned (its handlers restored: TERM's default action) killed the run as
    it recorded its outcome, or while Python exited: exit 143, the chain failed."""
    from tests.conftest import signals_while_ending

    code = ("import os, sys\n"
            "from train.cli import main\n"
            "from train.workloads.dqn import trainer\n"
            "train = trainer.train\n"
            "def ending(*args):\n"
            "    summary = train(*args)\n"
            f"    exec({signals_while_ending('os.getpid()', sig)!r})\n"
            "    return summary\n"
            "trainer.train = ending\n"
            f"sys.exit(main(['run', '--out', {str(tmp_path / 'r')!r}, '--episodes', '1',"
            " '--res', '8', '--episode-steps', '4', '--batch-size', '2', '--learning-starts',"
            " '2', '--replay-size', '8', '--eval-episodes', '0', '--device', 'cpu']))\n")
    env = {**os.environ, SIGNAL_READY_VAR: str(tmp_path / ".signal-ready-7-0")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert (tmp_path / "r" / "status.json").exists()


def test_early_handlers_tell_the_batch_shell_they_are_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal as signal_module

    from train.batch.contract import SIGNAL_READY_VAR
    from train.node import signals

    ready = tmp_path / ".signal-ready-7-0"
    monkeypatch.setenv(SIGNAL_READY_VAR, str(ready))
    previous = {s: signal_module.getsignal(s) for s in signals.STOP_SIGNALS}
    try:
        signals.install_early_handlers()
        assert ready.exists()
        monkeypatch.setenv(SIGNAL_READY_VAR, str(tmp_path / "missing" / "dir" / "x"))
        signals.install_early_handlers()  # an unwritable path is no failure
    finally:
        for sig, handler in previous.items():
            signal_module.signal(sig, handler)


def test_the_time_budget_is_cut_to_the_chunks_deadline() -> None:
    from train.node.signals import effective_budget

    env = {"TRAIN_DEADLINE": "1000"}
    assert effective_budget(600.0, env, now=300.0) == 600.0  # 700 s left: the budget holds
    assert effective_budget(600.0, env, now=700.0) == 300.0  # a wait used 400 s of it
    assert effective_budget(600.0, env, now=1200.0) == 1.0  # past it: checkpoint at once
    assert effective_budget(None, env, now=700.0) is None
    assert effective_budget(600.0, {}, now=700.0) == 600.0
    for odd in ("", "²", "x", "nan", "inf", "-5", "9" * 5000):
        assert effective_budget(600.0, {"TRAIN_DEADLINE": odd}, now=700.0) == 600.0


def test_a_stop_cuts_the_episode_after_the_grace() -> None:
    from train.node.signals import STOP_GRACE_SECONDS

    clock = FakeClock()
    stopper = StopController(None, clock)
    assert not stopper.overdue()
    stopper.request_stop("received SIGTERM")
    clock.now += STOP_GRACE_SECONDS - 1
    assert not stopper.overdue()  # the episode may still finish on its own
    clock.now += 1
    assert stopper.overdue()


def test_a_used_up_budget_cuts_the_episode() -> None:
    clock = FakeClock()
    stopper = StopController(20.0, clock)
    clock.now += 19.5
    assert not stopper.overdue()
    clock.now += 0.5
    assert stopper.overdue()
    assert stopper.reason is not None and "within an episode" in stopper.reason


def _restoring_stop_handlers() -> dict[int, object]:
    from train.node.signals import STOP_SIGNALS

    return {s: signal.getsignal(s) for s in STOP_SIGNALS}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_keep_their_default_action_during_start_up(
        sig: signal.Signals) -> None:
    """A Python handler never runs while start-up waits in C++ (a rendezvous): the default
    action ends the process there. Once the trainer has run, the restored handler is the
    default too."""
    from train.node.signals import install_early_handlers

    before = _restoring_stop_handlers()
    try:
        install_early_handlers()
        assert signal.getsignal(sig) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL  # kept for the trainer
        with StopController(None):
            assert signal.getsignal(sig) is not signal.SIG_DFL
        assert signal.getsignal(sig) is signal.SIG_DFL
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)  # type: ignore[arg-type]


def test_one_ctrl_c_after_a_walltime_signal_still_checkpoints() -> None:
    with StopController(None) as stopper:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: a clean stop, not at once
        assert stopper.reason == "received SIGUSR1"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


_RUN = ("['run', '--out', OUT, '--episodes', '2', '--res', '8', '--episode-steps', '4', "
        "'--batch-size', '2', '--learning-starts', '2', '--replay-size', '8', "
        "'--eval-episodes', '0', '--device', 'cpu']")


def _run_with_start_up_signal(out: Path,
                              sig: signal.Signals) -> subprocess.CompletedProcess[str]:
    """`train run` in a fresh process whose start-up (the checks before anything is
    written) receives `sig`; after SIGTERM it would then block for ten minutes."""
    code = (
        "import os, signal, sys, time\n"
        "from train.workloads import runner\n"
        "from train.cli import main\n"
        "checks = runner.validate\n"
        "def slow_validate(cfg):\n"
        "    checks(cfg)\n"
        f"    os.kill(os.getpid(), signal.{sig.name})\n"
        f"    if {sig.name!r} != 'SIGUSR1':\n"
        "        time.sleep(600)  # a rendezvous or a GPU wait that never ends\n"
        "runner.validate = slow_validate\n"
        f"OUT = {str(out)!r}\n"
        f"sys.exit(main({_RUN}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)


def test_sigterm_during_start_up_ends_the_process_before_writing(tmp_path: Path) -> None:
    proc = _run_with_start_up_signal(tmp_path / "r", signal.SIGTERM)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert not (tmp_path / "r" / "config.json").exists()


def test_sigterm_ends_a_start_up_stuck_in_a_rendezvous(tmp_path: Path) -> None:
    """Rank 0 of two, alone: init_process_group waits in C++ for the other rank (its
    timeout: 30 minutes); SIGTERM must end it there (a Python handler would never run)."""
    import socket
    import threading
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "train", "run", "--out",
                             str(tmp_path / "r"), "--res", "8", "--device", "cpu"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    started = threading.Event()

    def watch() -> None:  # the allocator line comes just before init_process_group
        assert proc.stderr is not None
        for line in proc.stderr:
            if "PYTORCH_CUDA_ALLOC_CONF" in line:
                started.set()

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    try:
        assert started.wait(timeout=300), "train run never reached its rendezvous"
        time.sleep(1)  # inside init_process_group's wait (the waits here are hang guards)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_walltime_signal_during_start_up_stops_before_the_first_episode(
        tmp_path: Path) -> None:
    out = tmp_path / "r"
    code_out = _run_with_start_up_signal(out, signal.SIGUSR1)
    assert code_out.returncode == 0, code_out.stderr[-2000:]
    status = json.loads((out / "status.json").read_text())
    assert status["complete"] is False and "SIGUSR1" in status["stop_reason"]
    assert [s["episodes"] for s in status["seeds"].values()] == [0]
    assert not list(out.glob("seed_*/checkpoints/ckpt-*.pt"))  # nothing new to save


def test_an_endless_episode_stops_at_the_time_budget(tmp_path: Path) -> None:
    """--episode-steps 1e9 with a budget: the episode is cut, its steps checkpointed, and
    a second chunk continues from them (the work is counted in steps, not seconds)."""
    from train.workloads.runtime.checkpoint import CheckpointManager

    out = tmp_path / "r"
    argv = ["run", "--out", str(out), "--episodes", "1", "--res", "8", "--episode-steps",
            "1000000000", "--batch-size", "2", "--learning-starts", "2", "--replay-size",
            "64", "--eval-episodes", "0", "--device", "cpu", "--time-budget", "2"]
    steps = []
    for _chunk in range(2):
        proc = subprocess.run([sys.executable, "-m", "train", *argv], capture_output=True,
                              text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "cut after" in proc.stderr
        status = json.loads((out / "status.json").read_text())
        assert status["complete"] is False and "time budget" in status["stop_reason"]
        [seed_dir] = out.glob("seed_*")
        state = CheckpointManager(seed_dir / "checkpoints").load_latest()
        assert state is not None and state["episode"] == 0
        steps.append(state["step"])
    assert 0 < steps[0] < steps[1]  # the second chunk went on from the first one's steps
