"""Hostile and surprising input: exit 2 naming the field, short messages, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from train.common import yamlio
from train.common.errors import ConfigError

BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['x'] * 9)}]\n"
               for p, c in zip(["", "a", "b", "c", "d", "e", "f", "g"], "abcdefgh", strict=True))


def test_yaml_alias_bomb_is_refused_from_its_count_not_its_memory(tmp_path: Path) -> None:
    assert len(BOMB) < 500  # 9**8 = 43 million values once expanded
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB)
    proc = run_cli(["run", "demo", "--config", str(cfg), "--out", str(tmp_path / "out")])
    assert proc.returncode == 2
    assert "expands to more than 100000 values through YAML aliases" in proc.stderr
    assert len(proc.stderr) < 400 and not (tmp_path / "out").exists()
    job = tmp_path / "job.yaml"
    job.write_text(BOMB)
    proc = run_cli(["render", str(job), "--cluster", "local"])
    assert proc.returncode == 2 and "YAML aliases" in proc.stderr


def test_yaml_aliases_within_the_bound_still_work() -> None:
    assert yamlio.load_text("a: &a [1, 2]\nb: *a\n", "x", "config") == {"a": [1, 2],
                                                                        "b": [1, 2]}


def test_oversized_yaml_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (yamlio.MAX_BYTES + 1) + "\n")
    with pytest.raises(ConfigError, match="limited to"):
        yamlio.load_file(big, "config")


@pytest.mark.parametrize(("text", "expected"), [
    ("time: 1:00:00", {"time": "1:00:00"}),  # YAML 1.1: the base-60 integer 3600
    ("lr: 1e-3", {"lr": 0.001}),              # YAML 1.1: the string "1e-3"
    ("lr: 5.0e-4", {"lr": 0.0005}),
    ("n: 010", {"n": 10}),                     # YAML 1.1: octal 8
    ("n: 0x10", {"n": 16}),
    ("x: .inf", {"x": float("inf")}),
    ("seeds: [4, 6]", {"seeds": [4, 6]}),
])
def test_yaml_numbers_follow_yaml_1_2(text: str, expected: dict[str, object]) -> None:
    assert yamlio.load_text(text, "x", "config") == expected


def test_job_file_time_and_run_config_lr_read_as_written(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("time: 1:00:00\nname: t\nruntime: none\nworkload: [demo, --episodes, '5']\n")
    proc = run_cli(["render", str(job), "--cluster", "local"])
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --time=01:00:00" in proc.stdout or "#SBATCH --time=1:00:00" in proc.stdout
    cfg = tmp_path / "run.yaml"
    cfg.write_text("lr: 1e-3\nepisodes: 1\neval_episodes: 0\nres: 4\nepisode_steps: 4\n")
    proc = run_cli(["run", "demo", "--config", str(cfg), "--device", "cpu", "--out",
                    str(tmp_path / "out")])
    assert proc.returncode == 0, proc.stderr
    assert '"lr": 0.001' in (tmp_path / "out" / "config.json").read_text()


FLOAT_FLAGS = ["--lr", "--gamma", "--eps-start", "--log-every", "--time-budget"]


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused_naming_the_field(flag: str, value: str) -> None:
    from train.workloads.config import build_config

    name = flag[2:].replace("-", "_")
    with pytest.raises(ConfigError, match=f"^{name}: must be"):
        build_config(flag_values={name: value})


def test_non_finite_number_is_exit_2_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli(["run", "demo", "--time-budget=nan", "--out", str(out)])
    assert proc.returncode == 2 and "time_budget: must be" in proc.stderr, proc.stderr
    assert not out.exists()


def test_a_huge_rejected_value_is_quoted_short(tmp_path: Path) -> None:
    proc = run_cli(["run", "demo", "--res", "x" * 100_000, "--out", str(tmp_path / "o")])
    assert proc.returncode == 2 and "res: must be an integer" in proc.stderr
    assert len(proc.stderr) < 300
    cfg = tmp_path / "c.yaml"
    cfg.write_text("device: " + "y" * 100_000 + "\n")
    proc = run_cli(["run", "demo", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert proc.returncode == 2 and "device: must be one of" in proc.stderr
    assert len(proc.stderr) < 300


def _profile(tmp_path: Path, edit: tuple[str, str]) -> Path:
    text = (REPO / "src" / "train" / "client" / "clusters" / "data" / "local.yaml").read_text()
    assert edit[0] in text
    path = tmp_path / "evil.yaml"
    path.write_text(text.replace("name: local", "name: evil").replace(*edit))
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (("nccl_env: {}", 'nccl_env: {"X=1; touch /tmp/pwned; Y": "1"}'),
     "nccl_env: 'X=1; touch /tmp/pwned; Y' is not an environment variable name"),
    (("nccl_env: {}", 'nccl_env: {NCCL_DEBUG: "INFO\\nrm -rf ~"}'),
     "nccl_env.NCCL_DEBUG: must not hold control characters"),
    (("nccl_env: {}", "nccl_env: [NCCL_DEBUG]"), "nccl_env: must be a mapping"),
])
def test_a_profile_cannot_inject_into_job_scripts(tmp_path: Path, edit: tuple[str, str],
                                                  message: str) -> None:
    path = _profile(tmp_path, edit)
    proc = run_cli(["render", "--profile", str(path), "--cluster", "evil", "--", "demo"])
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_profile_with_partitions_as_a_list_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "lst.yaml"
    path.write_text("name: lst\nextends: local\npartitions: [debug]\n")
    proc = run_cli(["render", "--profile", str(path), "--cluster", "lst", "--", "demo"])
    assert proc.returncode == 2 and "partitions: must be a mapping" in proc.stderr, \
        proc.stderr


def test_a_second_run_on_the_same_out_is_exit_2_naming_the_holder(tmp_path: Path) -> None:
    import os
    import socket

    from train.workloads.runtime.results import RunLock

    out = tmp_path / "out"
    out.mkdir()
    with RunLock(out):
        proc = run_cli(["run", "demo", "--device", "cpu", "--res", "6", "--episodes", "1",
                        "--out", str(out)])
        assert proc.returncode == 2, proc.stderr
        assert f"is in use by host {socket.gethostname()} pid {os.getpid()}" in proc.stderr
    assert not (out / "config.json").exists()  # the second run wrote nothing
    # the holder gone (its lock dies with it), the folder is free again
    with RunLock(out):
        pass


@pytest.mark.parametrize("args", [["--res", "100000"], ["--replay-size", "10000000000"]])
def test_a_run_that_cannot_fit_in_memory_is_exit_2_before_anything_is_written(
        tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "out"
    proc = run_cli(["run", "demo", "--device", "cpu", *args, "--out", str(out)])
    assert proc.returncode == 2, proc.stderr
    assert "replay_size: a replay of" in proc.stderr and "GiB of host memory" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_the_memory_estimate_counts_what_the_buffer_allocates() -> None:
    from train.workloads.dqn.replay import ReplayBuffer
    from train.workloads.envs.spec import ObsSpec

    buffer = ReplayBuffer(100, ObsSpec(8))
    assert ReplayBuffer.bytes_needed(100, ObsSpec(8)) == sum(
        a.nbytes for a in buffer.arrays.values())


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a {b: *a}\n", "a: &a\n  <<: *a\n",
                                  "res: 6\x00\n", "res: " + "9" * 5000 + "\n"])
def test_yaml_that_never_ends_or_cannot_convert_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError):
        yamlio.load_text(text, "x.yaml", "config")


def test_yaml_from_a_fifo_or_a_device_is_refused_without_reading_it(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(ConfigError, match="not a regular file"):
            yamlio.load_file(path, "config")


def test_the_run_lock_never_follows_a_link_or_opens_a_folder(tmp_path: Path) -> None:
    from train.workloads.runtime.results import RUN_LOCK, RunLock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / RUN_LOCK).symlink_to(victim)
    folder = tmp_path / "folder"
    (folder / RUN_LOCK).mkdir(parents=True)
    for out in (linked, folder):
        with pytest.raises(ConfigError, match="cannot lock"), RunLock(out):
            pass
    assert victim.read_text() == "precious\n"


def test_a_checkpoint_that_is_a_device_or_a_fifo_is_skipped_not_read(tmp_path: Path) -> None:
    import os

    from train.common.errors import CheckpointError
    from train.workloads.runtime.checkpoint import checksum_path, load

    zero = tmp_path / "ckpt-00000002.pt"
    zero.symlink_to("/dev/zero")
    checksum_path(zero).write_text("0" * 64 + "\n")
    fifo = tmp_path / "ckpt-00000003.pt"
    os.mkfifo(fifo)
    checksum_path(fifo).symlink_to("/dev/zero")
    for path in (zero, fifo):
        with pytest.raises(CheckpointError, match="not a regular file"):
            load(path)


def test_launch_masks_secrets_in_every_mode() -> None:
    env = {"SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "5", "SLURM_NODEID": "0",
           "SLURM_PROCID": "0", "SLURM_NNODES": "1", "SLURM_NTASKS": "1",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_LOCALID": "0", "TRAIN_MASTER_ADDR": "127.0.0.1"}
    proc = run_cli(["launch", "--mode", "tasks", "--", "true", "--wandb-key", "SEKRIT1"],
                   env=env)
    assert "SEKRIT1" not in proc.stderr + proc.stdout, proc.stderr
    assert "--wandb-key <redacted>" in proc.stderr


@pytest.mark.parametrize("value", ["abc", "1e3", "", "0"])
def test_a_garbled_local_world_size_counts_as_one_process(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from train.workloads.config import RunConfig
    from train.workloads.runner import check_memory

    monkeypatch.setenv("LOCAL_WORLD_SIZE", value)
    check_memory(RunConfig(res=6, replay_size=300))  # no ValueError, fits


def test_a_checksummed_checkpoint_of_foreign_shape_is_skipped_by_train_run(
        tmp_path: Path) -> None:
    """A file with a valid checksum that is not what the trainer wrote: resume from the one
    before, with a warning naming it, and set it aside (no KeyError traceback)."""
    from train.workloads.runtime.checkpoint import FORMAT, save_atomic

    out = tmp_path / "r"
    argv = ["run", "--out", str(out), "--res", "8", "--episode-steps", "4", "--batch-size",
            "2", "--learning-starts", "2", "--replay-size", "16", "--eval-episodes", "0",
            "--device", "cpu", "--seeds", "1", "--checkpoint-every", "1"]
    assert run_cli([*argv, "--episodes", "2"]).returncode == 0
    ckpts = out / "seed_1" / "checkpoints"
    save_atomic({"format": FORMAT, "episode": "two"}, ckpts / "ckpt-00000002.pt")
    proc = run_cli([*argv, "--episodes", "3"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ckpt-00000002.pt is unreadable" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "resumed at episode 1" in proc.stderr
    assert (ckpts / "damaged-ckpt-00000002.pt").is_file()
    assert json.loads((out / "status.json").read_text())["complete"] is True


@pytest.mark.parametrize("make", ["folder", "nested", "link", "huge"])
def test_a_run_record_that_is_not_a_small_json_file_is_exit_2(tmp_path: Path,
                                                               make: str) -> None:
    from train.common.errors import UsageError
    from train.workloads.config import run_config_from_argv
    from train.workloads.runrecord import RECORD_LIMIT, check_same_run

    out = tmp_path / "r"
    out.mkdir()
    record = out / "config.json"
    if make == "folder":
        record.mkdir()
    elif make == "nested":
        record.write_text("[" * 100_000 + "]" * 100_000)
    elif make == "link":
        (tmp_path / "other.json").write_text('{"config": {}}')
        record.symlink_to(tmp_path / "other.json")
    else:
        record.write_text('{"config": {}, "pad": "' + "x" * RECORD_LIMIT + '"}')
    cfg = run_config_from_argv(["--out", str(out)])
    with pytest.raises(UsageError, match=r"out: .*config\.json is not a readable run record"):
        check_same_run(cfg)


def test_the_fuzz_tiers_leftovers_are_clear_errors(tmp_path: Path) -> None:
    """What the fuzz tier found outside the parsers it covers: a progress file of '²' or
    5000 digits or not UTF-8, a results CSV whose name is too long, a list item that is a
    list in both the defaults and the job file, an env name with a trailing newline."""
    from train.batch import contract
    from train.batch.saves import file_progress as read_progress
    from train.client.defaults import merged
    from train.client.slurm.jobitems import check_env_item
    from train.client.slurm.jobspec import JobSpec
    from train.common.fields import build

    for text in ("\u00b2 3".encode(), b"9" * 5000 + b" 1", b"\xff\xfe 3"):
        (tmp_path / contract.PROGRESS_FILE).write_bytes(text)
        assert read_progress(tmp_path) is None
    (tmp_path / contract.PROGRESS_FILE).write_text("3 10\n")
    assert read_progress(tmp_path) == (3, 10)
    proc = run_cli(["run", "--out", str(tmp_path / "r"), "--results-csv",
                    str(tmp_path / ("x" * 300) / "r.csv")])
    assert proc.returncode == 2 and "results_csv: " in proc.stderr, proc.stderr
    with pytest.raises(ConfigError, match=r"^env: "):
        build(JobSpec, merged({"env": ["A"]}, {"env": [[1]]}), {})
    with pytest.raises(ConfigError, match=r"^env: "):
        check_env_item("A\n")


def test_an_attempt_that_never_trained_pins_no_settings(tmp_path: Path) -> None:
    """config.json written by a start that failed before training (an OOM at the dummy
    step) must not refuse the fix its error suggests (a smaller --batch-size)."""
    from train.workloads.config import run_config_from_argv
    from train.workloads.runrecord import check_same_run

    out = tmp_path / "r"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"config": {"batch_size": 1024}}))  # (valid)
    check_same_run(run_config_from_argv(["--out", str(out), "--batch-size", "32"]))
    (out / "seed_4" / "checkpoints").mkdir(parents=True)
    (out / "seed_4" / "checkpoints" / "ckpt-00000001.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match="batch_size: differs"):
        check_same_run(run_config_from_argv(["--out", str(out), "--batch-size", "32"]))


def test_the_cpu_allocators_failure_at_the_dummy_step_is_exit_3() -> None:
    import torch

    from train.common.errors import PreallocationError
    from train.workloads.runtime.memory import preallocate

    def step() -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                           "not enough memory: you tried to allocate 1073741824 bytes.")

    with pytest.raises(PreallocationError, match="out of memory on cpu"):
        preallocate(step, device=torch.device("cpu"), state_bytes=1, what="a batch")

    def other() -> None:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        preallocate(other, device=torch.device("cpu"), state_bytes=1, what="a batch")


def test_every_seeds_checkpoint_folder_is_checked_before_any_seed_trains(
        tmp_path: Path) -> None:
    out = tmp_path / "r"
    (out / "seed_6" / "checkpoints" / "ckpt-00000003.pt").mkdir(parents=True)
    proc = run_cli(["run", "--out", str(out), "--seeds", "4 6", "--res", "8",
                    "--episode-steps", "4", "--episodes", "2", "--device", "cpu"])
    assert proc.returncode == 2 and "ckpt-00000003.pt is not a regular file" in proc.stderr
    assert not (out / "seed_4").exists()  # seed 4 never trained


def test_a_run_that_fell_back_to_a_smaller_batch_resumes_with_either(
        tmp_path: Path) -> None:
    """train launch's GPU memory wait fell back to --batch-size 1 (TRAIN_FALLBACK_BATCH):
    that chunk resumes the batch-2 run, and later chunks with batch 2 resume it too."""
    out = tmp_path / "r"
    argv = ["run", "--out", str(out), "--res", "8", "--episode-steps", "4",
            "--learning-starts", "2", "--replay-size", "16", "--eval-episodes", "0",
            "--device", "cpu", "--seeds", "1", "--checkpoint-every", "1"]
    assert run_cli([*argv, "--batch-size", "2", "--episodes", "1"]).returncode == 0
    refused = run_cli([*argv, "--batch-size", "1", "--episodes", "2"])
    assert refused.returncode == 2 and "batch_size: differs" in refused.stderr
    proc = run_cli([*argv, "--batch-size", "1", "--episodes", "2"],
                   env={"TRAIN_FALLBACK_BATCH": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_cli([*argv, "--batch-size", "2", "--episodes", "3"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "status.json").read_text())["complete"] is True


def test_train_launch_never_marks_the_program_ready_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch shell passes the walltime USR1 on once the ready file exists: only the
    program (train run marks itself) may say it has its handlers."""
    import signal

    from train import cli
    from train.node import launch

    ready = tmp_path / "ready"
    monkeypatch.setenv("TRAIN_SIGNAL_READY", str(ready))
    seen = []
    monkeypatch.setattr(launch, "launch", lambda opts: seen.append(ready.exists()) or 0)
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM,
                                                signal.SIGINT)}
    try:
        assert cli.main(["launch", "--mode", "single", "--", "python", "-m", "train",
                         "run"]) == 0
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert seen == [False] and not ready.exists()
