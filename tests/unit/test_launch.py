from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from tests.unit.test_cuda_check import OK as USABLE  # a healthy node's facts
from train.batch import contract
from train.common import cuda_check
from train.common.errors import UsageError
from train.node.launch import LaunchOptions, prepare
from train.node.launcher.environment import cap_workers
from train.node.launcher.step import read_step, tasks_env, torchrun_argv


@pytest.fixture(autouse=True)
def _cuda_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """ENV gives the step two GPUs: these tests are about the rest of `prepare`, on a
    machine with or without a GPU (tests/unit/test_cuda_check.py checks the check)."""
    monkeypatch.setattr(cuda_check, "gather_facts", lambda env=None: USABLE)


ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-a[01-02]", "SLURM_NNODES": "2",
       "SLURM_NODEID": "1", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
       "SLURM_NTASKS_PER_NODE": "2", "SLURM_CPUS_PER_TASK": "8",
       "CUDA_VISIBLE_DEVICES": "0,1"}


def test_read_step_and_rendezvous() -> None:
    step = read_step(ENV)
    assert step.nodes == ["gpu-a01", "gpu-a02"] and step.master == "gpu-a01"
    assert step.port == 20000 + 4242 % 10000 and step.gpus_on_node == 2
    assert tasks_env(step, "10.0.0.1") == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": str(step.port)}


def test_the_engines_port_is_the_rendezvous_and_the_last_free_one_wraps() -> None:
    # the engine picked a port free on the first node: every rank meets there
    assert read_step({**ENV, "TRAIN_MASTER_PORT": "23456"}).port == 23456
    last = contract.PORT_BASE + contract.PORT_SPAN - 1
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", last))
        taken.listen()
        assert contract.free_job_port(last - contract.PORT_BASE) == contract.PORT_BASE
    assert contract.job_port(4242 + contract.PORT_SPAN) == contract.job_port(4242)


def test_the_engines_port_is_free_in_ipv6_and_on_a_host_without_ipv4(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener on IPv6 alone leaves IPv4's port free, and an IPv6-only host makes no
    IPv4 socket at all (the engine died of that)."""
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    first = contract.job_port(7)
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as taken:
        taken.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        taken.bind(("::", first))
        taken.listen()
        assert contract.free_job_port(7) != first
    real = socket.socket

    def no_ipv4(family: int = socket.AF_INET, *args: object) -> socket.socket:
        if family == socket.AF_INET:
            raise OSError(97, "Address family not supported by protocol")
        return real(family, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socket", no_ipv4)
    assert contract.PORT_BASE <= contract.free_job_port(7) < contract.PORT_BASE + contract.PORT_SPAN


@pytest.mark.parametrize("value", ["70000", "x", "0", "-1", "65536", " 123", "1e4",
                                   "20000(x2)", "+2", "0x50"])
def test_a_given_port_that_is_no_port_is_named(value: str) -> None:
    """The engine writes digits alone: anything else (0 too, which meant "unset") is
    refused, as an empty value means the job id's port."""
    with pytest.raises(UsageError, match=re.escape(f"TRAIN_MASTER_PORT={value!r} is no port: "
                                                   "a number 1-65535")):
        read_step({**ENV, "TRAIN_MASTER_PORT": value})
    assert read_step({**ENV, "TRAIN_MASTER_PORT": ""}).port == contract.job_port(4242)


@pytest.mark.parametrize(("change", "var"), [
    ({"SLURM_JOB_NODELIST": None}, "SLURM_JOB_NODELIST"),
    ({"SLURM_JOB_ID": None}, "SLURM_JOB_ID"),
    ({"SLURM_NNODES": "3"}, "SLURM_NNODES=3 disagrees"),
    ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 is outside"),
    ({"SLURM_PROCID": "9"}, "SLURM_PROCID=9 is outside"),
    ({"SLURM_NTASKS": "four"}, "SLURM_NTASKS must be an integer"),
])
def test_missing_or_inconsistent_variables_are_named(change: dict[str, str | None],
                                                     var: str) -> None:
    env = {k: v for k, v in {**ENV, **change}.items() if v is not None}
    with pytest.raises(UsageError, match=var):
        read_step(env)


def test_torchrun_argv_static_rendezvous_on_first_node() -> None:
    step = read_step(ENV)
    argv = torchrun_argv(step, "10.0.0.1", 2, ["python3", "-m", "train", "run", "demo"])
    assert argv[:6] == ["--nnodes=2", "--node-rank=1", "--nproc-per-node=2",
                        "--master-addr=10.0.0.1", f"--master-port={step.port}",
                        "--rdzv-id=4242"]
    assert argv[6:] == ["-m", "train", "run", "demo"]
    assert torchrun_argv(step, "h", 1, ["./script.sh", "x"])[-3:] == ["--no-python",
                                                                     "./script.sh", "x"]


def test_worker_cap_by_cpus_and_memory() -> None:
    gib = 1024**3
    assert cap_workers(8, 8, 4, 256 * gib, 16 * gib)[0] == 4  # memory: 256 / (4 x 16)
    assert cap_workers(8, 4, 1, 256 * gib, gib)[0] == 3  # CPUs: one kept for training
    assert cap_workers(2, 8, 1, 256 * gib, gib)[0] == 2


def test_prepare_caps_workers_sets_nccl_and_skips_gpu_wait_on_cpu(
        caplog: pytest.LogCaptureFixture) -> None:
    env = {**ENV, "CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_NODELIST": "localhost"}
    env["SLURM_NNODES"], env["SLURM_NODEID"] = "1", "0"
    opts = LaunchOptions(mode="tasks", command=["python3", "-m", "train", "run"],
                         min_free_mb=1000, workers=16, worker_mem_mb=1)
    with caplog.at_level("INFO"):
        _step, master, command = prepare(opts, env)
    assert master == "127.0.0.1" and command == opts.command
    assert env["TRAIN_DATALOADER_WORKERS"] == "7"  # 8 CPUs per task, one kept
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "GPU memory wait skipped: no GPU on this node" in caplog.text
    assert "NCCL settings" in caplog.text and "InfiniBand" in caplog.text
    with pytest.raises(UsageError, match="give the command after --"):
        prepare(LaunchOptions(mode="tasks", command=[]), dict(env))


def test_master_address_override_for_unresolvable_node_names() -> None:
    env = {**ENV, "TRAIN_MASTER_ADDR": "10.9.8.7"}  # gpu-a01 resolves nowhere
    _step, master, _cmd = prepare(LaunchOptions(mode="tasks", command=["true"]), env)
    assert master == "10.9.8.7"


def test_worker_override_in_the_command_gets_the_capped_value() -> None:
    env = {**ENV, "TRAIN_MASTER_ADDR": "10.0.0.1"}
    opts = LaunchOptions(mode="tasks", command=["python", "train.py",
                                                "dataloader.params.num_workers=8"],
                         workers=8, worker_mem_mb=1)
    _step, _master, command = prepare(opts, env)
    assert command[-1] == "dataloader.params.num_workers=7"  # 8 CPUs, one kept


def test_the_gpu_memory_wait_ends_before_the_chunks_deadline() -> None:
    from train.node.launcher.environment import MIN_WORK_SECONDS, wait_budget

    env = {"TRAIN_DEADLINE": "10000"}
    assert wait_budget(3600.0, env, now=1000.0) == 3600.0
    assert wait_budget(3600.0, env, now=8000.0) == 2000.0 - MIN_WORK_SECONDS
    assert wait_budget(3600.0, env, now=9990.0) == 0.0
    assert wait_budget(3600.0, {}, now=9990.0) == 3600.0


def test_scontrol_requeue_inside_the_step_asks_the_batch_shell_instead(
        tmp_path: Path) -> None:
    import subprocess

    from train.node.launcher.environment import install_scontrol_shim

    real = tmp_path / "bin"
    real.mkdir()
    (real / "scontrol").write_text("#!/bin/sh\necho real \"$@\"\n")
    (real / "scontrol").chmod(0o755)
    env = {"PATH": f"{real}:/usr/bin:/bin", "TRAIN_RUN_DIR": str(tmp_path)}
    assert install_scontrol_shim(env) == tmp_path / ".scontrol-shim"  # in the run folder
    request = tmp_path / ".stop-request-1-0"
    proc = subprocess.run(["scontrol", "requeue", "77"], env={
        **env, "TRAIN_STOP_REQUEST": str(request)}, capture_output=True, text=True,
        check=False)
    assert proc.returncode == 0 and "real" not in proc.stdout  # never the real requeue
    assert request.read_text() == "requeue 77\n" and "asked to requeue" in proc.stderr
    proc = subprocess.run(["scontrol", "show", "job"], env=env, capture_output=True,
                          text=True, check=False)
    assert proc.stdout == "real show job\n"  # anything else goes to the real one


def test_every_task_asking_at_once_gets_its_request_written(tmp_path: Path) -> None:
    """Lightning under --launch tasks: each task runs `scontrol requeue` at the same
    moment; a shared temporary name made some of them fail (exit 1, the chunk failed)."""
    import subprocess

    from train.node.launcher.environment import install_scontrol_shim

    env = {"PATH": "/usr/bin:/bin", "TRAIN_RUN_DIR": str(tmp_path)}
    assert install_scontrol_shim(env) is not None
    request = tmp_path / ".stop-request-9-0"
    for _ in range(25):
        procs = [subprocess.Popen(["scontrol", "requeue", "9"], env={
            **env, "TRAIN_STOP_REQUEST": str(request), "SLURM_PROCID": str(rank)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for rank in range(4)]
        codes = [p.wait(timeout=60) for p in procs]
        assert codes == [0, 0, 0, 0]
        assert request.read_text() == "requeue 9\n"
    assert not list(tmp_path.glob(".stop-request-9-0.tmp*"))


def test_the_stand_in_never_finds_itself_again(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from train.node.launcher.environment import install_scontrol_shim

    tools = tmp_path / "tools"  # what the stand-in uses, and no scontrol
    tools.mkdir()
    for name in ("sh", "dirname", "tr", "paste", "mv"):
        found = shutil.which(name)
        assert found
        (tools / name).symlink_to(found)
    env = {"PATH": str(tools), "TRAIN_RUN_DIR": str(tmp_path)}
    folder = install_scontrol_shim(env)
    assert folder is not None
    # the same directory spelled otherwise, and no real scontrol behind it
    env["PATH"] = f"{folder}/:{folder}/.:{env['PATH']}"
    proc = subprocess.run(["scontrol", "show", "hostnames"], env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 127 and "scontrol" in proc.stderr  # not found: no loop
    proc = subprocess.run(["scontrol", "requeue", "5"], capture_output=True, text=True,
                          env={**env, "TRAIN_STOP_REQUEST": str(tmp_path / "no" / "x")},
                          timeout=30, check=False)
    assert proc.returncode == 1 and "could not be written" in proc.stderr


def test_workers_capped_to_none_make_navsims_prefetch_null() -> None:
    """A task with one CPU has no worker to spare: NAVSIM's DataLoader then needs
    prefetch_factor null (torch refuses a prefetch factor without workers)."""
    env = {**ENV, "TRAIN_MASTER_ADDR": "10.0.0.1", "SLURM_CPUS_PER_TASK": "1"}
    opts = LaunchOptions(mode="tasks", command=["python", "train.py",
                                                "dataloader.params.num_workers=4"],
                         workers=4, worker_mem_mb=1)
    _step, _master, command = prepare(opts, env)
    assert command[-2:] == ["dataloader.params.num_workers=0",
                            "dataloader.params.prefetch_factor=null"]
    # workers left: no prefetch override added
    _step, _master, command = prepare(LaunchOptions(
        mode="tasks", command=["python", "train.py", "dataloader.params.num_workers=4"],
        workers=4, worker_mem_mb=1), {**ENV, "TRAIN_MASTER_ADDR": "10.0.0.1"})
    assert not any("prefetch_factor" in a for a in command)


def test_the_gpu_memory_wait_never_sleeps_past_its_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--wait-timeout 1 with the 10 s poll: the wait ends after 1 s, not 10."""
    import sys
    import types
    from typing import ClassVar

    from train.node.launcher import environment as launch_mod  # (the wait reads its own `time`)

    class Clock:
        now = 0.0
        slept: ClassVar[list[float]] = []

        @classmethod
        def monotonic(cls) -> float:
            return cls.now

        @classmethod
        def sleep(cls, seconds: float) -> None:
            cls.slept.append(seconds)
            cls.now += seconds

    info = types.SimpleNamespace(free=10 * launch_mod.MIB)
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetMemoryInfo=lambda h: info)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(launch_mod, "time", Clock)
    assert launch_mod.wait_for_gpu_memory(1000, 1.0) is False
    assert Clock.slept == [1.0] and Clock.now == 1.0


# -- each rank's own signal-readiness file (the batch shell waits for every rank's)

def test_a_ranks_ready_file_is_the_steps_with_its_rank() -> None:
    from train.batch.contract import rank_ready_path

    base = "/runs/a.rank-9/x/.signal-ready-7-0"  # (a folder's name is never cut)
    assert rank_ready_path(base, 3) == base + ".rank-3"
    # a suffix an outer wrapper gave (the task's) is replaced by the worker's
    assert rank_ready_path(base + ".rank-1", 5) == base + ".rank-5"


def test_the_agent_passes_the_stop_only_to_workers_that_catch_it_now(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm signals every process of the step: a worker already exiting after its save
    (no handler any more, as a Python at exit) must not get the agent's copy too."""
    import signal
    import subprocess
    import sys

    from train.node.launcher.step import _forward_to_workers, catches

    monkeypatch.setenv("TRAIN_STOP_SIGNAL", "USR1")
    catcher = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys\n"
         "signal.signal(signal.SIGUSR1, lambda *_: print('saved', flush=True))\n"
         "print('ready', flush=True)\nsys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    exiting = subprocess.Popen(["sleep", "60"])
    try:
        assert catcher.stdout is not None and catcher.stdout.readline() == "ready\n"
        assert catches(catcher.pid, signal.SIGUSR1)
        assert not catches(exiting.pid, signal.SIGUSR1)
        _forward_to_workers(signal.SIGUSR1, None)
        assert catcher.stdout.readline() == "saved\n"
        with pytest.raises(subprocess.TimeoutExpired):  # not killed by a stop it no
            exiting.wait(timeout=1)                      # longer catches
    finally:
        exiting.kill()
        catcher.kill()
        exiting.wait()
        catcher.wait()


def test_the_agent_passes_the_stop_to_a_worker_that_waits_for_it_blocked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that takes its stop in a thread of its own with sigwait (or a signalfd)
    blocks the signal and has no handler: under the Docker runtime only the agent is
    signalled, and its copy is the worker's only one."""
    import signal
    import subprocess
    import sys

    from train.node.launcher.step import _forward_to_workers, catches

    monkeypatch.setenv("TRAIN_STOP_SIGNAL", "USR1")
    waiter = subprocess.Popen(
        [sys.executable, "-c", "import signal, threading\n"
         "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"
         "got = []\n"
         "t = threading.Thread(target=lambda: got.append(signal.sigwait({signal.SIGUSR1})))\n"
         "t.start()\nprint('ready', flush=True)\nt.join()\n"
         "print('saved', got[0], flush=True)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout is not None and waiter.stdout.readline() == "ready\n"
        assert catches(waiter.pid, signal.SIGUSR1)
        _forward_to_workers(signal.SIGUSR1, None)
        out, _ = waiter.communicate(timeout=60)
        assert out == f"saved {int(signal.SIGUSR1)}\n" and waiter.returncode == 0
    finally:
        waiter.kill()
        waiter.wait()


def test_launch_gives_each_task_and_each_torchrun_worker_its_own_ready_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import string
    import subprocess
    import sys

    from train.node.launcher.step import ready_per_rank

    base = str(tmp_path / ".signal-ready-7-0")
    env = {"TRAIN_SIGNAL_READY": base + ".rank-2"}  # the per-task wrapper's value
    assert ready_per_rank("tasks", 2, ["prog"], env) == ["prog"]
    assert env["TRAIN_SIGNAL_READY"] == base + ".rank-2"
    env = {"TRAIN_SIGNAL_READY": base}  # runtime none: no wrapper before the launcher
    ready_per_rank("single", 4, ["prog"], env)
    assert env["TRAIN_SIGNAL_READY"] == base + ".rank-4"
    assert ready_per_rank("tasks", 0, ["prog"], {}) == ["prog"]  # not in a job step
    # torchrun: the agent's task is node 1's; each worker gets its own file, with the
    # local rank torch's launcher puts in for ${local_rank} (an image without `env`: the
    # agent's Python sets the worker's RANK's)
    env = {"TRAIN_SIGNAL_READY": base + ".rank-1"}
    touch = ["sh", "-c", 'touch "$TRAIN_SIGNAL_READY"']
    argv = ready_per_rank("torchrun", 1, touch, env)
    assert env["TRAIN_SIGNAL_READY"] == base + ".rank-1"  # the agent's own is kept
    for local in ("0", "1"):
        subprocess.run([string.Template(arg).safe_substitute(local_rank=local)
                        for arg in argv],
                       env={"PATH": "/usr/bin:/bin"}, check=True, timeout=60)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    argv = ready_per_rank("torchrun", 2, touch, {"TRAIN_SIGNAL_READY": base + ".rank-2"})
    subprocess.run([string.Template(arg).safe_substitute(local_rank="0") for arg in argv],
                   env={"PATH": "/usr/bin:/bin", "RANK": "5",
                        "TRAIN_SIGNAL_READY": base + ".rank-2"}, check=True, timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".signal-ready-7-0.rank-1-0", ".signal-ready-7-0.rank-1-1", ".signal-ready-7-0.rank-5"]
    # `python -m` keeps the agent's interpreter, as torchrun's own `-m` would
    assert ready_per_rank("torchrun", 0, ["python3", "-m", "train", "run"], env)[3:] == [
        sys.executable, "-m", "train", "run"]


@pytest.mark.parametrize("folder", ["a$$b", "a${local_rank}b", "a$HOME", "a$"])
def test_a_torchrun_workers_ready_file_keeps_a_run_folders_dollar(
        tmp_path: Path, folder: str) -> None:
    """torch's launcher substitutes each worker argument as a string.Template (its
    `${local_rank}` macro): the run folder's `$` in the readiness file's path stays."""
    import string
    import subprocess

    from train.node.launcher.step import ready_per_rank

    (tmp_path / folder).mkdir()
    base = str(tmp_path / folder / ".signal-ready-7-0")
    argv = ready_per_rank("torchrun", 1, ["sh", "-c", 'touch "$TRAIN_SIGNAL_READY"'],
                          {"TRAIN_SIGNAL_READY": base + ".rank-1"})
    worker = [string.Template(arg).safe_substitute(local_rank="0") for arg in argv]
    subprocess.run(worker, env={"PATH": "/usr/bin:/bin"}, check=True, timeout=60)
    assert [p.name for p in (tmp_path / folder).iterdir()] == [".signal-ready-7-0.rank-1-0"]


@pytest.mark.parametrize("ready", [True, False])
def test_a_torchrun_workers_arguments_reach_it_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ready: bool) -> None:
    """torch's launcher substitutes each worker argument as a string.Template: a
    program's `$$`, `${local_rank}` arrive as written, as they do in tasks mode (with the
    readiness wrapper, its Python stand-in, and outside a chain's step)."""
    import shutil
    import string
    import subprocess

    from train.node.launcher.step import ready_per_rank

    written = ["a$$b", "${local_rank}", "$HOME", "$(id)", "$"]
    program = ["sh", "-c", 'printf "%s|" "$@" > "$0"', str(tmp_path / "args"), *written]
    env = {"TRAIN_SIGNAL_READY": str(tmp_path / ".signal-ready-7-0")} if ready else {}
    wrappers = [True, False] if ready else [True]
    for with_env in wrappers:
        if not with_env:
            monkeypatch.setattr(shutil, "which", lambda name: None)
        argv = ready_per_rank("torchrun", 1, program, dict(env))
        worker = [string.Template(arg).safe_substitute(local_rank="0") for arg in argv]
        subprocess.run(worker, env={"PATH": "/usr/bin:/bin"}, check=True, timeout=60)
        assert (tmp_path / "args").read_text() == "|".join(written) + "|"
        (tmp_path / "args").unlink()


def test_one_process_gets_what_torchs_launcher_would_give_it(tmp_path: Path) -> None:
    """A script written for torchrun (LOCAL_RANK read, a plain init_process_group()) runs
    as the one process of a job: rank 0 of 1 on loopback, on a free port, also where
    the node's name resolves nowhere."""
    import os
    import subprocess
    import sys

    script = tmp_path / "torchrun_only.py"
    script.write_text(
        "import os\nimport torch.distributed as dist\n"
        "local = int(os.environ['LOCAL_RANK'])\n"
        "dist.init_process_group('gloo')\n"
        "print(dist.get_rank(), dist.get_world_size(), local,\n"
        "      *(os.environ[v] for v in ('LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')))\n"
        "dist.destroy_process_group()\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(sys.path),
           "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node-nowhere.invalid",
           "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
           "SLURM_NTASKS": "1", "SLURM_CPUS_PER_TASK": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "train", "launch", "--mode", "single", "--",
                           sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    rank, world, local, local_world, addr, port = proc.stdout.split()
    assert (rank, world, local, local_world, addr) == ("0", "1", "0", "1", "127.0.0.1")
    assert 0 < int(port) < 65536 and "rank 0 of 1" in proc.stderr


@pytest.mark.parametrize(("mode", "gpus", "expected", "threads"), [
    # 2 nodes of 4 GPUs under the job's launcher: accelerate launch once per node, 8 in all
    ("torchrun", "0,1,2,3", ["--num_processes=8", "--num_machines=2", "--machine_rank=1",
                             "--main_process_ip=10.0.0.1", "--main_process_port=24242"], "2"),
    # a CPU node of a 2-node job: one process a node
    ("torchrun", "", ["--num_processes=2", "--num_machines=2", "--machine_rank=1",
                      "--main_process_ip=10.0.0.1", "--main_process_port=24242"], "8"),
])
def test_accelerate_launch_is_the_nodes_launcher_with_the_jobs_shape(
        monkeypatch: pytest.MonkeyPatch, mode: str, gpus: str, expected: list[str],
        threads: str) -> None:
    """Issue 39: under torch's launcher each of a node's N workers ran `accelerate launch`,
    which started N processes of its own (N x N ranks)."""
    import os
    import sys

    from train.node import launch as node_launch

    ran: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(os, "execvpe", lambda f, argv, env: ran.append((argv, env)))
    monkeypatch.setattr(node_launch, "run_torchrun",  # (a worker per GPU, each launching)
                        lambda *args: pytest.fail("accelerate launch ran under torchrun"))
    env = {**ENV, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2",
           "SLURM_NTASKS_PER_NODE": "1", "CUDA_VISIBLE_DEVICES": gpus,
           "TRAIN_MASTER_ADDR": "10.0.0.1", "PATH": str(Path(sys.executable).parent)}
    command = ["accelerate", "launch", "--mixed_precision", "bf16", "fit.py", "--lr", "3"]
    node_launch.launch(LaunchOptions(mode=mode, command=command,
                                     nproc_per_node=len(gpus.split(",")) if gpus else None),
                       env)
    [(argv, seen)] = ran
    assert argv == ["accelerate", "launch", *expected, *command[2:]], argv
    # the program of accelerate's one process (a CPU or one GPU) finds the node's rank
    assert (seen["RANK"], seen["WORLD_SIZE"], seen["MASTER_ADDR"]) == ("1", "2", "10.0.0.1")
    # the task's 8 CPUs shared by its processes (not the node's cores, accelerate's guess)
    assert seen["OMP_NUM_THREADS"] == threads


def test_accelerate_launch_as_the_one_process_of_a_job(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    import os
    import sys

    from train.common.launchers import accelerate_prefix
    from train.node import launch as node_launch

    ran: list[list[str]] = []
    monkeypatch.setattr(os, "execvpe", lambda f, argv, env: ran.append(argv))
    env = {**ENV, "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
           "CUDA_VISIBLE_DEVICES": "0", "PATH": str(Path(sys.executable).parent)}
    node_launch.launch(LaunchOptions(mode="single", command=["accelerate-launch", "f.py"]),
                       env)
    [argv] = ran
    assert argv[1:6] == ["--num_processes=1", "--num_machines=1", "--machine_rank=0",
                         "--main_process_ip=127.0.0.1", f"--main_process_port={env['MASTER_PORT']}"]
    assert argv[-1] == "f.py"
    assert [accelerate_prefix(c) for c in (["accelerate", "launch", "x.py"], ["x/accelerate-launch"],
                                           ["python3", "-m", "accelerate.commands.launch"],
                                           ["accelerate", "config"], ["python", "x.py"], [])] == \
        [2, 1, 3, 0, 0, 0]


def test_accelerate_launchs_own_options_end_at_its_script_or_module() -> None:
    """`accelerate launch -m pkg.train --num_processes 4`: the module's own argument was
    refused as accelerate's (only a .py word ended its options)."""
    from train.common.launchers import given_job_options

    assert given_job_options(["accelerate", "launch", "-m", "pkg.train", "--num_processes",
                              "4"]) == []
    assert given_job_options(["accelerate", "launch", "--module", "pkg.train",
                              "--machine_rank=1"]) == []
    assert given_job_options(["accelerate", "launch", "--num_processes=2", "-m", "pkg.t",
                              "--num_machines", "3"]) == ["--num_processes"]
    assert given_job_options(["accelerate", "launch", "--num_processes", "2", "f.py",
                              "--num_machines", "3"]) == ["--num_processes"]


def test_a_job_steps_launch_line_starts_without_the_other_commands(tmp_path: Path) -> None:
    """`python -m train launch ... -- COMMAND`, as each task of a step runs it, imports no
    other command's parser before the program starts (each task's start paid for them)."""
    import os
    import subprocess
    import sys

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(sys.path),
           "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1",
           "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "train", "launch",
                           "--mode=tasks", "--", sys.executable, "-c", "print('ran')"],
                          capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr
    imported = {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "train.node.launch" in imported and "train.cli" not in imported


@pytest.mark.parametrize("options", [
    [], ["--mode", "tasks"], ["--mode=single", "--chdir", "sub dir"],
    ["--mode", "torchrun", "--nproc-per-node", "2", "--min-free-mb", "900",
     "--wait-timeout", "30", "--fallback-batch", "8", "--workers", "4",
     "--worker-mem-mb", "512"]])
def test_the_light_launch_line_is_parsed_as_the_cli_parses_it(
        monkeypatch: pytest.MonkeyPatch, options: list[str]) -> None:
    from train.cli import build_parser
    from train.node import nodeentry

    seen = []
    monkeypatch.setattr(nodeentry, "run_launch", lambda args, command: seen.append(
        (vars(args), command)) or 0)
    monkeypatch.setattr(nodeentry, "setup_logging", lambda: None)
    assert nodeentry.light_launch(["launch", *options, "--", "prog", "--mode", "x"]) == 0
    cli = vars(build_parser().parse_args(["launch", *options]))
    assert seen == [({k: v for k, v in cli.items() if k not in ("command", "verbose")},
                     ["prog", "--mode", "x"])]


@pytest.mark.parametrize("argv", [
    ["launch", "--help", "--", "prog"], ["launch", "-h", "--", "prog"],
    ["launch", "--mode", "tasks"], ["launch", "--mode", "tasks", "--"],
    ["launch", "--mo", "tasks", "--", "prog"], ["launch", "--mode", "bogus", "--", "prog"],
    ["launch", "--workers", "many", "--", "prog"], ["launch", "stray", "--", "prog"],
    ["-v", "launch", "--", "prog"], ["run", "--", "prog"], []])
def test_a_line_the_light_launch_does_not_take_whole_goes_to_the_cli(
        monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    """Help, no command, and every line the CLI's parser refuses or words otherwise: the
    CLI answers (its help, its errors with their hints, exit 2)."""
    from train.node import nodeentry

    monkeypatch.setattr(nodeentry, "run_launch", lambda args, command: pytest.fail(argv))
    assert nodeentry.light_launch(argv) is None
