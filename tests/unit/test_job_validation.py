"""Every bad job input is a ConfigError naming the field (exit 2, nothing submitted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from train.client.clusters.profiles import Registry
from train.client.slurm.chain import parse_events
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.queue import parse_sacct, parse_sbatch_id, parse_squeue_json
from train.client.slurm.resolve import resolve
from train.common.errors import ConfigError, UsageError
from train.common.fields import build
from train.common.yamlio import load_text

REG = Registry(environ={})
GIL = dict(cluster="gilbreth", account="lab", partition="a30", qos="standby", time="2:00:00",
           gpus_per_node=1, runtime="none")


def _resolve(**kw: Any) -> Any:
    spec = JobSpec(**{"runtime": "none", **kw})  # the runtime is not what these test
    return resolve(spec, REG.get(spec.cluster))


def _fails(field: str, match: str, **kw: Any) -> str:
    with pytest.raises((ConfigError, UsageError)) as err:
        _resolve(**kw)
    assert getattr(err.value, "field", field) == field, str(err.value)
    assert match in str(err.value), str(err.value)
    return str(err.value)


def test_valid_gilbreth_job() -> None:
    job = _resolve(**GIL)
    assert job.partition == "a30" and job.minutes == 120 and job.launch == "single"
    assert job.time_budget_seconds == 120 * 60 - 300


def test_missing_account_says_how_to_list_them() -> None:
    _fails("account", "slist", **{**GIL, "account": None})
    _fails("account", "my_slurm_accounts", cluster="torch", constraint="h200")


def test_unknown_partition_lists_them() -> None:
    msg = _fails("partition", "unknown partition 'a40'", **{**GIL, "partition": "a40"})
    assert "a30" in msg and "a100-80gb" in msg


def test_partition_on_torch_says_use_a_constraint() -> None:
    _fails("partition", "request GPUs with --constraint", cluster="torch", account="torch_pr_1",
           partition="h200_public")
    _fails("constraint", "one of h200, l40s", cluster="torch", account="torch_pr_1")
    _fails("constraint", "unknown constraint 'a100'", cluster="torch", account="torch_pr_1",
           constraint="h200|a100")


def test_walltime_over_qos_and_partition_limits() -> None:
    msg = _fails("time", "QOS standby limit of 04:00:00", **{**GIL, "time": "5:00:00"})
    assert "05:00:00" in msg
    _fails("time", "over the gpu-mig limit", cluster="rivanna", account="g",
           partition="gpu-mig", time="4-00:00:00")
    _fails("qos", "unknown QOS 'debug'", **{**GIL, "qos": "debug"})


def test_resources_over_the_node() -> None:
    _fails("gpus_per_node", "more than the 3 GPUs", **{**GIL, "gpus_per_node": 4})
    _fails("cpus_per_task", "more than the 32 CPUs", **{**GIL, "cpus_per_task": 64})
    _fails("mem", "more than the 250G", **{**GIL, "mem": "300G"})
    _fails("nodes", "limit of 4 nodes", cluster="rivanna", account="g", nodes=5,
           gpus_per_node=8)
    # 4 x 8 = 32 GPUs is exactly Rivanna's per-job limit: allowed; on Torch 24 is the cap
    assert _resolve(cluster="rivanna", account="g", nodes=4, gpus_per_node=8)
    _fails("gpus_per_node", "24-GPU limit", cluster="torch", account="torch_pr_1",
           constraint="h200", nodes=4, gpus_per_node=8)


def test_a_multi_node_job_on_rivannas_gpu_partition_takes_whole_nodes() -> None:
    """UVA RC: multi-node jobs take all 8 GPUs of a node (the profile's gpu partition has
    multi_node_whole: true); one node may take fewer."""
    riv = dict(cluster="rivanna", account="g", gpu_type="a100")
    msg = _fails("gpus_per_node", "rivanna's gpu partition: a job of more than one node "
                 "takes all 8 GPUs of each node: -g 8 (or one node)", **riv, nodes=2,
                 gpus_per_node=4)
    assert "2 nodes of 4" in msg
    assert _resolve(**riv, nodes=2, gpus_per_node=8).spec.nodes == 2
    assert _resolve(**riv, nodes=1, gpus_per_node=4).spec.gpus_per_node == 4
    # the site's other partitions have no such rule
    assert _resolve(cluster="rivanna", account="g", partition="interactive", nodes=2,
                    gpus_per_node=1).spec.nodes == 2


def test_whole_nodes_are_a_profiles_rule_refused_at_load_when_not_a_boolean(
        tmp_path: Path) -> None:
    # Gilbreth's profile has no such rule: 2 nodes of 1 A30 are a job
    assert _resolve(**{**GIL, "nodes": 2}).spec.nodes == 2
    profile = tmp_path / "whole.yaml"
    node = "{gpus_per_node: 3, cpus_per_node: 32, mem_per_node: 250G, max_time: '4:00:00'"
    profile.write_text(f"name: whole\nextends: gilbreth\npartitions:\n  a30: {node}, "
                       "multi_node_whole: true}\n")
    reg = Registry([profile], environ={})
    assert reg.get("whole").partitions["a30"].multi_node_whole
    job = {**GIL, "cluster": "whole", "nodes": 2}
    with pytest.raises(ConfigError) as err:
        resolve(JobSpec(**job), reg.get("whole"))
    assert err.value.field == "gpus_per_node"
    assert "whole's a30 partition: a job of more than one node takes all 3 GPUs" \
        in str(err.value)
    assert resolve(JobSpec(**{**job, "gpus_per_node": 3}), reg.get("whole")).spec.nodes == 2
    profile.write_text(f"name: whole\nextends: gilbreth\npartitions:\n  a30: {node}, "
                       "multi_node_whole: 'yes'}\n")
    with pytest.raises(ConfigError) as err:
        Registry([profile], environ={})
    assert err.value.field == "profile whole.partitions.a30.multi_node_whole"
    assert "must be true or false, got 'yes'" in str(err.value)


def test_gpu_type_the_partition_lacks() -> None:
    msg = _fails("gpu_type", "has no 'h100' GPUs", **{**GIL, "gpu_type": "h100"})
    assert "a30" in msg
    _fails("gpu_type", "set gpus_per_node", **{**GIL, "gpus_per_node": 0, "gpu_type": "a30"})


def test_dataloader_workers_over_memory_suggests_a_safe_count() -> None:
    # the field notes' 16-GPU host OOM: 4 L40S per node, 8 workers each, 256 GB nodes
    msg = _fails("workers", "use --workers 3 (at most 3 per process)", cluster="torch",
                 account="torch_pr_1", constraint="l40s", nodes=4, gpus_per_node=4,
                 launch="tasks", cpus_per_task=8, mem="200G", workers=8, worker_mem="16G")
    assert "8 DataLoader workers x 4 processes per node" in msg and "--worker-mem" in msg
    ok = _resolve(cluster="torch", account="torch_pr_1", constraint="l40s", nodes=4,
                  gpus_per_node=4, launch="tasks", cpus_per_task=8, mem="200G", workers=2,
                  worker_mem="16G")
    assert ok.processes_per_node == 4


def test_cpus_and_memory_scale_with_the_gpus_in_every_launch_mode() -> None:
    """Issue 19: under torchrun a 4-GPU node got 4 CPUs and 32 GB for 4 ranks, while one
    task per GPU got 16 CPUs and 125G for the same job."""
    base = dict(cluster="rivanna", account="grp", nodes=2, gpus_per_node=8, gpu_type="a100",
                entry="command", stop_signal="USR1", workload=("python", "t.py"))
    torchrun = _resolve(**base, launch="torchrun")
    tasks = _resolve(**base, launch="tasks")
    assert torchrun.ntasks_per_node == 1 and tasks.ntasks_per_node == 8
    assert torchrun.spec.cpus_per_task == 32 and tasks.spec.cpus_per_task == 4
    assert torchrun.mem_mb == tasks.mem_mb == 250 * 1024
    single = _resolve(**{**base, "nodes": 1, "gpus_per_node": 1})
    assert single.launch == "single" and single.spec.cpus_per_task == 4
    # within the node: 3 A30 a 32-CPU Gilbreth node (4 x 3 = 12 fits); a given count stays
    assert _resolve(**{**GIL, "gpus_per_node": 3}, entry="command", launch="torchrun",
                    workload=("x",)).spec.cpus_per_task == 12
    assert _resolve(**base, launch="torchrun", cpus_per_task=8).spec.cpus_per_task == 8
    tiny = _resolve(cluster="torch", account="torch_pr_1", constraint="l40s",
                    gpus_per_node=4, launch="torchrun", entry="command", stop_signal="USR1",
                    workload=("x",))
    assert tiny.spec.cpus_per_task == 16 and tiny.mem_mb == 64 * 1024


def test_a_gpu_partition_without_gpus_is_refused_unless_the_profile_allows_cpu_jobs(
        tmp_path: Path) -> None:
    msg = _fails("gpus_per_node", "-g N (--gpus-per-node, 1 to 3)",
                 **{**GIL, "gpus_per_node": 0})
    assert "partition a30" in msg and "CPU" in msg
    _fails("gpus_per_node", "-g N", cluster="torch", account="torch_pr_1",
           constraint="h200|l40s")
    _fails("gpus_per_node", "-g N", cluster="rivanna", account="grp")
    assert _resolve(cluster="local").spec.gpus_per_node == 0  # cpu_jobs: true
    profile = tmp_path / "cpu.yaml"
    profile.write_text("name: cpu\nextends: gilbreth\npartitions:\n  a30: {gpus_per_node: "
                       "3, cpus_per_node: 32, mem_per_node: 250G, max_time: '4:00:00', "
                       "cpu_jobs: true}\n  cpu: {gpus_per_node: 0, cpus_per_node: 64, "
                       "mem_per_node: 250G, max_time: '4:00:00'}\n")
    reg = Registry([profile], environ={})
    for part in ("a30", "cpu"):
        job = resolve(JobSpec(**{**GIL, "cluster": "cpu", "partition": part,
                                 "gpus_per_node": 0}), reg.get("cpu"))
        assert job.spec.gpus_per_node == 0
    profile.write_text("name: cpu\nextends: local\npartitions:\n  debug: {gpus_per_node: 2, "
                       "cpus_per_node: 4, mem_per_node: 8000M, max_time: '1:00', "
                       "cpu_jobs: 'yes'}\n")
    with pytest.raises(ConfigError) as err:
        Registry([profile], environ={})
    assert err.value.field == "profile cpu.partitions.debug.cpu_jobs"


def test_runtime_follows_the_image_and_a_torch_job_needs_one_or_a_python() -> None:
    assert _resolve(**{**GIL, "runtime": "auto"}, image="/x.sif").spec.runtime == "apptainer"
    msg = _fails("runtime", "--runtime apptainer --image X.sif", **{**GIL, "runtime": "auto"})
    assert "--runtime none --python /path/to/env/bin/python" in msg
    env = _resolve(**{**GIL, "runtime": "auto"}, python="/depot/lab/env/bin/python")
    assert env.spec.runtime == "none"
    assert _resolve(**{**GIL, "runtime": "none"}).spec.runtime == "none"  # chosen: kept
    # navsim needs torch, and so does a program on GPUs (issue 39: one on one GPU died after
    # the queue); a program of one's own on CPUs in one process is its own business
    _fails("runtime", "NAVSIM", **{**GIL, "runtime": "auto"}, entry="navsim")
    _fails("runtime", "a program on GPUs (-g) needs torch", **{**GIL, "runtime": "auto"},
           entry="command", workload=("python", "train.py"))
    own = _resolve(cluster="local", runtime="auto", entry="command", workload=("./a.sh",))
    assert own.spec.runtime == "none"
    _fails("runtime", "torchrun", **{**GIL, "runtime": "auto", "gpus_per_node": 2},
           entry="command", workload=("python", "t.py"))


def test_tasks_launch_needs_one_task_per_gpu() -> None:
    _fails("ntasks_per_node", "equal to the GPUs per node (4)", cluster="torch",
           account="torch_pr_1", constraint="l40s", gpus_per_node=4, launch="tasks",
           ntasks_per_node=1)
    _fails("ntasks_per_node", "runs one task per node", cluster="torch",
           account="torch_pr_1", constraint="h200", gpus_per_node=8, launch="torchrun",
           ntasks_per_node=8)


def test_workload_arguments_checked_before_submission() -> None:
    _fails("workload", "must be one of demo, sc2", **{**GIL, "workload": ("atari",)})
    _fails("episodes", "greater than 0", **{**GIL, "workload": ("demo", "--episodes", "0")})
    _fails("workload", "--out is set by the job", **{**GIL, "workload": ("demo", "--out",
                                                                         "x")})


def test_other_field_checks() -> None:
    _fails("name", "letters, digits", **{**GIL, "name": "a b"})
    _fails("image", "needs --image", **{**GIL, "runtime": "apptainer"})
    _fails("preempt", "no preemptible", **{**GIL, "preempt": True})
    _fails("signal_margin", "leaves no time", **{**GIL, "time": "5", "signal_margin": 300})
    for bad in (0, -1, 1001, 10**20):
        with pytest.raises(ConfigError) as err:
            JobSpec(max_chunks=bad)
        assert err.value.field == "max_chunks"
    _fails("out", "file system root", cluster="local", out="/", workload=("demo",))


def test_the_results_csv_must_be_reachable_from_the_container(tmp_path: Path) -> None:
    docker = {"cluster": "local", "runtime": "docker", "image": "img:1",
              "out": str(tmp_path / "runs" / "d")}
    # the default CSV beside the run directory: its directory is bound too
    job = _resolve(**docker, workload=("demo",))
    assert job.results_csv == str(tmp_path / "runs" / "results.csv")
    assert job.binds == (str(tmp_path / "runs" / "d"), str(tmp_path / "runs"))
    # inside the run directory: nothing more to bind
    inside = str(tmp_path / "runs" / "d" / "r.csv")
    job = _resolve(**docker, workload=("demo", "--results-csv", inside))
    assert job.results_csv == inside and job.binds == (str(tmp_path / "runs" / "d"),)
    # anywhere else: refused, naming the field and what the container sees
    _fails("results_csv", "outside what the docker container sees", **docker,
           workload=("demo", "--results-csv", "/var/tmp/all.csv"))
    # the host sees every path
    job = _resolve(**{**docker, "runtime": "none", "image": None},
                   workload=("demo", "--results-csv", "/var/tmp/all.csv"))
    assert job.results_csv == "/var/tmp/all.csv"


def test_a_relative_results_csv_is_taken_from_the_submit_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    job = _resolve(cluster="local", workload=("demo", "--results-csv", "r/all.csv"))
    assert job.results_csv == str(tmp_path / "r" / "all.csv")
    assert job.run_dir == str(tmp_path / "runs" / "train")


def test_shell_metacharacters_are_not_an_error() -> None:
    hostile = "$(touch /tmp/pwned); `id` ; 'q' \"d\"\nnext"
    job = _resolve(**{**GIL, "workload": ("demo", "--results-csv", hostile)})
    assert job.spec.workload[-1] == hostile


def test_cli_bad_job_exits_2_and_submits_nothing(tmp_path: Path) -> None:
    proc = run_cli(["submit", "--cluster", "gilbreth", "--account", "lab", "--partition",
                    "a30", "--qos", "standby", "--time", "5:00:00", "--", "demo"],
                   cwd=tmp_path, env={"PATH": "/nonexistent:/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert "time: 05:00:00 is over the QOS standby limit" in proc.stderr
    assert list(tmp_path.iterdir()) == []
    proc = run_cli(["submit", "-M", "rivanna", "-A", "grp", "--runtime", "none", "-N", "2",
                    "-g", "4", "--", "demo"], cwd=tmp_path,
                   env={"PATH": "/nonexistent:/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert "gpus_per_node: rivanna's gpu partition: a job of more than one node takes all " \
           "8 GPUs of each node: -g 8 (or one node)" in proc.stderr
    assert list(tmp_path.iterdir()) == []
    proc = run_cli(["render", "--cluster", "anvil", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 2 and "known clusters:" in proc.stderr


def test_scheduler_output_parsers() -> None:
    assert parse_sbatch_id("1234\n") == "1234"
    assert parse_sbatch_id("77;cluster\n") == "77"
    squeue = ('{"jobs": [{"job_id": 5, "job_state": "PENDING", "state_reason": '
              '"Dependency"}, {"job_id": 6, "job_state": ["RUNNING"]}]}')
    parsed = parse_squeue_json(squeue)
    assert parsed["5"]["state"] == "PENDING" and parsed["5"]["reason"] == "Dependency"
    assert parsed["6"]["state"] == "RUNNING"
    sacct = "12|COMPLETED|0:0\n12.batch|COMPLETED|0:0\n13|CANCELLED by 0|0:0\n14|FAILED|1:0\n"
    states = parse_sacct(sacct)
    assert states == {"12": {"state": "COMPLETED", "exit": "0:0"},
                      "13": {"state": "CANCELLED", "exit": "0:0"},
                      "14": {"state": "FAILED", "exit": "1:0"}}
    events = parse_events("1700000000 1 12 started\n1700000100 1 12 failed 3\ngarbage\n")
    assert [e["event"] for e in events] == ["started", "failed"]
    assert events[1]["detail"] == "3"


def test_login_node_commands_do_not_import_torch(tmp_path: Path) -> None:
    # login nodes are slow and their file systems slower: render/submit/status stay light
    code = ("import sys\nfrom train.cli import main\n"
            "rc = main(['render', '--cluster', 'local', '--runtime', 'none', '--', 'demo'])\n"
            "assert rc == 0, rc\n"
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n")
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=debug" in proc.stdout


def test_navsim_preset_matches_the_job() -> None:
    from train.client.slurm.navsimstep import navsim_command

    job = _resolve(cluster="torch", account="torch_pr_1", constraint="l40s", nodes=4,
                   gpus_per_node=4, gpu_type="l40s", cpus_per_task=8, mem="200G",
                   workers=2, entry="navsim", workload=("agent=hydra_mdp",))
    assert job.launch == "tasks" and job.ntasks_per_node == 4 and job.run_config is None
    cmd = navsim_command(job)
    assert cmd[1].endswith("navsim/planning/script/run_training.py")
    assert cmd[2] == "train_test_split=navtrain"  # NAVSIM requires a split
    # every chunk shares one Lightning root: its SLURM checkpoint is found and resumed
    assert cmd[3] == f"trainer.params.default_root_dir={job.run_dir}/lightning"
    assert cmd[4:] == ["trainer.params.num_nodes=4", "+trainer.params.devices=4",
                       "trainer.params.strategy=ddp", "trainer.params.accelerator=gpu",
                       "trainer.params.precision=bf16-mixed",
                       "dataloader.params.num_workers=2",
                       f"cache_path={job.run_dir}/navsim-cache", "agent=hydra_mdp"]
    v100 = _resolve(**{**GIL, "partition": "v100", "qos": None, "gpu_type": "v100",
                       "gpus_per_node": 2, "entry": "navsim", "workload": ()})
    assert "trainer.params.precision=16-mixed" in navsim_command(v100)
    # no type on the mixed training partition: the job may land on a V100
    training = _resolve(**{**GIL, "partition": "training", "qos": "training",
                           "gpus_per_node": 4, "entry": "navsim", "workload": ()})
    assert "trainer.params.precision=16-mixed" in navsim_command(training)
    _fails("launch", "one task per GPU", cluster="torch", account="torch_pr_1",
           constraint="l40s", gpus_per_node=4, entry="navsim", launch="torchrun")


def test_command_entry_is_not_parsed_as_train_run() -> None:
    job = _resolve(**{**GIL, "entry": "command", "workload": ("python", "fit.py", "--x")})
    assert job.launch == "single" and job.run_config is None


def test_a_tiny_memory_share_never_renders_as_the_whole_node(tmp_path: Path) -> None:
    """mem_per_node 64M over 128 CPUs: one CPU's share rounds down to 0 MB, and
    --mem=0 is Slurm's 'all of the node's memory'."""
    from train.client.slurm.render import render

    profile = tmp_path / "tiny.yaml"
    profile.write_text("name: tiny\nextends: local\npartition: {default: p}\n"
                       "partitions:\n  p: {gpus_per_node: 0, cpus_per_node: 128, "
                       "mem_per_node: 64M, max_time: '1:00:00'}\n")
    reg = Registry([profile], environ={})
    job = resolve(JobSpec(cluster="tiny", cpus_per_task=1, time="10", runtime="none"),
                  reg.get("tiny"))
    assert job.mem_mb == 1
    assert "#SBATCH --mem=0" not in render(job)


def test_the_chunk_floor_defaults_to_a_quarter_of_the_walltime_for_a_chain() -> None:
    # 2 hours, margin 300 s: a quarter (30 min)
    assert _resolve(**GIL).time_min == 30
    # 30 min, margin 300 s: a quarter, 8 min (a 10-minute hole before a maintenance fits)
    assert _resolve(**{**GIL, "time": "30"}).time_min == 8
    # 16 min, margin 240 s (a quarter of it): a quarter would be 4 min, the margin's 4 min
    # and a minute of work is 5
    assert _resolve(**{**GIL, "time": "16"}).time_min == 5
    assert _resolve(**{**GIL, "time_min": "off"}).time_min == 0
    assert _resolve(**{**GIL, "time_min": "45"}).time_min == 45
    assert _resolve(**{**GIL, "time_min": "2:00:00"}).time_min == 0  # the walltime itself
    # no chain, no stop signal, requeue mode: every chunk asks for its whole walltime
    assert _resolve(**{**GIL, "max_chunks": 1}).time_min == 0
    assert _resolve(**{**GIL, "requeue": True}).time_min == 0
    assert _resolve(**{**GIL, "stop_signal": "none", "max_chunks": 1}).time_min == 0


def test_the_floor_turned_off_as_a_job_file_or_a_flag_writes_it() -> None:
    """`time_min: off` in YAML (the docs' word, unquoted) reads as false, and OFF is off
    too; a value that is no time names off among what is allowed."""
    for text in ("time_min: off", "time_min: OFF", "time_min: 'Off'", "time_min: no"):
        spec = build(JobSpec, {**GIL, **load_text(text, "JOB.yaml", "config")})
        assert resolve(spec, REG.get(spec.cluster)).time_min == 0, text
    assert _resolve(**{**GIL, "time_min": "OFF"}).time_min == 0
    assert _fails("time_min", "is not a SLURM time", **{**GIL, "time_min": "never"}) \
        .endswith(", or off")


def test_a_chunk_floor_that_cannot_work_is_refused_naming_time_min() -> None:
    _fails("time_min", "is over the walltime", **{**GIL, "time_min": "3:00:00"})
    _fails("time_min", "no minute of work before its stop signal (300 s before its end): "
           "give at least 00:06:00", **{**GIL, "time_min": "5"})
    _fails("time_min", "requeue mode", **{**GIL, "requeue": True, "time_min": "30"})
    _fails("time_min", "has none (--stop-signal none)",
           **{**GIL, "stop_signal": "none", "max_chunks": 1, "time_min": "30"})
    _fails("time_min", "is not a SLURM time", **{**GIL, "time_min": "soon"})
    _fails("time_min", "must be more than 0", **{**GIL, "time_min": "0"})
    _fails("sbatch_extra", "time_min", **{**GIL, "sbatch_extra": ("--time-min=10",)})
