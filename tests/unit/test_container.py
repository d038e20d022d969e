"""The container runtimes' argv, and the engine's task wrapper around `docker run`
(train.batch.task) with a stub `docker` on PATH: naming, labelling, the task's user, signal
forwarding, removal and exit status, without a Docker engine."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import spawn_group
from tests.golden.cases import CASES, rendered, script_step
from train.batch.contract import DOCKER_JOB_LABEL
from train.batch.engine import install
from train.client import container

HOSTILE = ["r $(id); `id` 'q' \"d\"\n.csv", "", "*", "--name", "a\\b", "$SLURM_JOB_ID"]


def test_docker_prefix_runs_each_task_through_the_wrapper() -> None:
    argv = container.runtime_prefix("docker", image="train-base:ci", gpus=True,
                                    binds=["/scratch"], run_dir="/scratch/runs/x",
                                    env={"PYTHONUNBUFFERED": "1"})
    assert argv[:2] == ["docker", "run"]  # the task wrapper adds its own options
    options = argv[2:]
    assert options[:5] == ["--rm", "--init", "--sig-proxy=false", "--stop-signal", "TERM"]
    assert options[options.index("HOME=/tmp") - 1] == "-e"
    assert options[options.index("--gpus") + 1] == "all"
    assert options[-4:] == ["/scratch/runs/x", "--entrypoint", "env", "train-base:ci"]
    for path in ("/scratch", "/scratch/runs/x"):
        assert f"{path}:{path}" in options


# A stand-in for the docker CLI. `run` records its argv and becomes the "container" (a
# Python loop whose behaviour STUB_MODE chooses), as the real CLI stays attached until the
# container ends and exits with its status; the container's pid file is its existence
# (--rm: gone when it ends). `kill`, `stop -t N` and `rm -f` act on that process by name.
STUB_CONTAINER = r"""
import os, signal, sys, time
folder, name = sys.argv[1], sys.argv[2]
mode = os.environ.get("STUB_MODE", "")

def done(rc):
    try:
        os.unlink(f"{folder}/{name}.pid")
    except FileNotFoundError:
        pass
    sys.exit(rc)

def note(what):
    with open(f"{folder}/got", "a") as fh:
        fh.write(what + "\n")

if mode == "exit":
    done(int(os.environ["STUB_RC"]))
if mode == "race":  # Slurm's USR1 reaches the task just as the container ends by itself
    def parent(pid):
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])

    def is_task(pid):  # the wrapper runs as `python3 -E -s ENGINE task -- ...`
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"\0task\0--\0" in fh.read()

    task = os.getppid()
    while is_task(parent(task)):
        task = parent(task)
    os.kill(task, signal.SIGUSR1)
    done(0)
for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, signal.SIG_DFL)
if mode == "trap":
    signal.signal(signal.SIGUSR1, lambda *_: note("USR1"))
    signal.signal(signal.SIGTERM, lambda *_: (note("TERM"), done(5)))
elif mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
open(f"{folder}/ready", "w").close()
while True:
    time.sleep(0.02)
"""

STUB_DOCKER = r"""#!/bin/bash
printf '%s\n' "$*" >> "$STUB_DIR/calls"
case "$1" in
run)
    printf '%s\0' "${@:2}" > "$STUB_DIR/run.argv"
    echo "$$" > "$STUB_DIR/${3}.pid"
    # the "container": its own signal dispositions, whatever the CLI inherited
    exec python3 -c "$STUB_CONTAINER" "$STUB_DIR" "$3" ;;
kill)
    [ -s "$STUB_DIR/$4.pid" ] || { echo "No such container: $4" >&2; exit 1; }
    kill "-$3" "$(cat "$STUB_DIR/$4.pid")" ;;
stop)
    [ -s "$STUB_DIR/$4.pid" ] || exit 1
    pid=$(cat "$STUB_DIR/$4.pid")
    kill -TERM "$pid"
    for _ in $(seq $(($3 * 50))); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.02; done
    kill -KILL "$pid"
    rm -f "$STUB_DIR/$4.pid" ;;
rm)
    [ -s "$STUB_DIR/$3.pid" ] || exit 1
    kill -KILL "$(cat "$STUB_DIR/$3.pid")" 2>/dev/null
    rm -f "$STUB_DIR/$3.pid" ;;
wait) echo "Error response from daemon: No such container: $2" >&2; exit 1 ;;
esac
"""
NAME = "train-77-0-3-1"  # job 77, no restart, step 3, rank 1


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(STUB_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmUser=root\nkillwait = 9\nKillWait=2\nMinJobAge=600\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", STUB_DIR=str(tmp_path),
               SLURM_JOB_ID="77", SLURM_STEP_ID="3", SLURM_PROCID="1",
               SLURM_CONF=str(conf), STUB_CONTAINER=STUB_CONTAINER)
    env["WRAPPER"] = install(str(tmp_path))
    yield env


def _wrapper(env: dict[str, str]) -> list[str]:
    return [sys.executable, "-E", "-s", env["WRAPPER"], "task", "--", "docker", "run"]


def _start(env: dict[str, str], mode: str, args: list[str] | None = None,
           rc: int = 0) -> subprocess.Popen[str]:
    argv = [*_wrapper(env), *(args or ["--init", "img", "python3"])]
    return spawn_group(argv, env={**env, "STUB_MODE": mode, "STUB_RC": str(rc)})


def _ready(env: dict[str, str], proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 10
    while not (Path(env["STUB_DIR"]) / "ready").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the stub container never started"
        time.sleep(0.02)


def _calls(env: dict[str, str]) -> list[str]:
    return (Path(env["STUB_DIR"]) / "calls").read_text().splitlines()


def _no_container_left(env: dict[str, str]) -> bool:
    return not (Path(env["STUB_DIR"]) / f"{NAME}.pid").exists()


def test_named_labelled_container_runs_as_the_task_user_with_arguments_verbatim(
        stub: dict[str, str]) -> None:
    args = ["--init", "-e", "HOME=/tmp", "--entrypoint", "env", "img", "python3", *HOSTILE]
    proc = _start(stub, "exit", args, rc=3)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err  # the container's status is the task's
    argv = (Path(stub["STUB_DIR"]) / "run.argv").read_text().split("\0")[:-1]
    uid, gid = os.getuid(), os.getgid()
    user = pwd.getpwuid(uid).pw_name
    assert argv[:8] == ["--name", NAME, "--label", f"{DOCKER_JOB_LABEL}=77", "--user",
                        f"{uid}:{gid}", "-e", f"USER={user}"]
    groups = argv[8:-len(args)]
    assert groups[::2] == ["--group-add"] * (len(groups) // 2)
    assert set(groups[1::2]) == {str(g) for g in os.getgroups()} | {str(gid)}
    assert argv[-len(args):] == args  # byte for byte, after the wrapper's own options
    assert _calls(stub)[-1] == f"rm -f {NAME}"  # removed once it ended


def test_the_container_name_tells_restarts_apart(stub: dict[str, str]) -> None:
    proc = _start({**stub, "SLURM_RESTART_COUNT": "2"}, "exit")
    proc.communicate(timeout=30)
    assert _calls(stub)[0].startswith("run --name train-77-2-3-1 ")


def test_outside_a_slurm_task_the_wrapper_refuses(stub: dict[str, str]) -> None:
    env = {k: v for k, v in stub.items() if k != "SLURM_STEP_ID"}
    proc = _start(env, "exit")
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "SLURM_STEP_ID" in err
    assert not (Path(stub["STUB_DIR"]) / "calls").exists()


def test_usr1_reaches_the_container_which_goes_on_and_term_stops_it(
        stub: dict[str, str]) -> None:
    proc = _start(stub, "trap")
    _ready(stub, proc)
    proc.send_signal(signal.SIGUSR1)
    got = Path(stub["STUB_DIR"]) / "got"
    deadline = time.monotonic() + 10
    while not got.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got.read_text() == "USR1\n"
    assert proc.poll() is None  # the walltime signal asks for a checkpoint, not an exit
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert got.read_text() == "USR1\nTERM\n"
    assert proc.returncode == 5, err  # the container's status, not 143
    calls = _calls(stub)
    assert f"kill --signal USR1 {NAME}" in calls
    assert f"stop -t 2 {NAME}" in calls  # TERM once, KILL at slurm.conf's KillWait (2 s)
    assert f"kill --signal TERM {NAME}" not in calls
    assert calls[-1] == f"rm -f {NAME}" and _no_container_left(stub)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_container_that_ignores_the_stop_is_killed_at_killwait(
        stub: dict[str, str], sig: signal.Signals) -> None:
    proc = _start(stub, "ignore")
    _ready(stub, proc)
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=60)
    # killed by `docker stop -t KillWait` (2 s here); no bound on the time: busy machines
    assert proc.returncode == 128 + signal.SIGKILL, err
    calls = _calls(stub)
    assert f"stop -t 2 {NAME}" in calls and _no_container_left(stub)
    # INT is forwarded as it is; TERM is what `docker stop` sends
    assert (f"kill --signal INT {NAME}" in calls) == (sig == signal.SIGINT)
    assert f"kill --signal TERM {NAME}" not in calls


def test_without_killwait_in_slurm_conf_the_stop_waits_slurms_default(
        stub: dict[str, str]) -> None:
    proc = _start({**stub, "SLURM_CONF": "/nonexistent/slurm.conf"}, "trap")
    _ready(stub, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 5 and f"stop -t 30 {NAME}" in _calls(stub)


def test_rendered_docker_step_reaches_docker_verbatim(stub: dict[str, str]) -> None:
    case = "local-multinode"
    assert CASES[case]["runtime"] == "docker"
    # the step as bash makes it from the script, from the wrapper on (srun's part left out)
    step = script_step(rendered(case))
    proc = subprocess.run([*_wrapper(stub), *step[step.index("docker") + 2:]],
                          env={**stub, "STUB_MODE": "exit",
                                                           "STUB_RC": "0"},
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    argv = (Path(stub["STUB_DIR"]) / "run.argv").read_text().split("\0")[:-1]
    hostile = CASES[case]["workload"][-1]
    assert "\n" in hostile and hostile in argv
    assert argv[argv.index("--entrypoint"):argv.index("--entrypoint") + 3] == [
        "--entrypoint", "env", "train-base:ci"]
    assert argv[:2] == ["--name", NAME]


def test_a_signal_as_the_container_ends_never_changes_its_exit_status(
        stub: dict[str, str]) -> None:
    # the task's status is the container's even when a trap runs as the container ends
    codes = []
    for _ in range(60):
        proc = subprocess.run([*_wrapper(stub), "--init", "img", "python3"],
                              env={**stub, "STUB_MODE": "race"},
                              capture_output=True, text=True, timeout=30, check=False)
        codes.append(proc.returncode)
    assert set(codes) == {0}, codes
