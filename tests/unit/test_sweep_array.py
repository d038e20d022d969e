"""Sweeps as one Slurm job array: the tasks a sweep makes, the array's script, the
array-size limit, and what `train status` prints for a sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from train.batch.saves import parse_ids
from train.client.clusters.profiles import Registry
from train.client.slurm.chain import parse_events
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import job_record, render
from train.client.slurm.resolve import resolve
from train.client.slurm.sweep import split, task_job
from train.client.slurm.sweeparray import array_script, array_spec, format_sweep_status
from train.common.errors import ConfigError


def test_a_value_sweep_sets_the_flag_per_task_and_a_command_gets_its_task(
        tmp_path: Path) -> None:
    spec = JobSpec(cluster="local", name="lr", out=str(tmp_path / "lr"),
                   sweep="lr=1e-3,5e-4", workload=("demo", "--seeds", "7"))
    _root, specs = split(spec)
    assert [(t.index, t.value, t.seed, t.dir) for t, _ in specs] == [
        (0, "1e-3", 7, "task-0"), (1, "5e-4", 7, "task-1")]
    assert specs[1][1].workload == ("demo", "--seeds", "7", "--lr", "5e-4")
    assert specs[1][1].out == str(tmp_path / "lr" / "task-1") and specs[1][1].sweep is None
    command = JobSpec(cluster="local", name="c", entry="command", runtime="none",
                      python="python3", sweep="alpha=a,b", workload=("python3", "x.py"))
    _root, specs = split(command)
    task, one = specs[1]
    assert one.workload == ("python3", "x.py")  # the command itself is not changed
    job = task_job(task, resolve(one, Registry().get("local")))
    assert ("TRAIN_SWEEP_INDEX", "1") in job.env_values
    assert ("TRAIN_SWEEP_VALUE", "b") in job.env_values


@pytest.mark.parametrize(("kw", "field", "message"), [
    (dict(sweep="lr"), "sweep", "must be NAME=V1,V2"),
    (dict(sweep="lr=1,,2"), "sweep", "must be NAME=V1,V2"),
    (dict(sweep="lr=1,1"), "sweep", "values must differ"),
    (dict(sweep="x=a\x1b[2Jb,c"), "sweep", "'a\\x1b[2Jb' holds a control character"),
    (dict(sweep="x=a\tb,c"), "sweep", "'a\\tb' holds a control character"),
    (dict(sweep="seeds=1,2"), "sweep", "--sweep-seeds"),
    (dict(sweep="lr=1,2", sweep_seeds=(1, 2)), "sweep", "not both"),
    (dict(sweep="lr=1,2", workload=("demo", "--lr", "3")), "sweep", "give the lr once"),
    # a throttle above the task count throttles nothing (and Slurm refuses a huge one)
    (dict(sweep="lr=1,2", sweep_throttle=3), "sweep_throttle", "1 to 2"),
    (dict(sweep_seeds=(1,), sweep_throttle=99999999999), "sweep_throttle", "1 to 1"),
])
def test_bad_value_sweeps_are_refused(kw: dict[str, object], field: str,
                                      message: str) -> None:
    with pytest.raises(ConfigError) as err:
        split(JobSpec(**kw))  # type: ignore[arg-type]
    assert err.value.field == field and message in str(err.value)


def test_a_sweep_over_the_array_size_limit_is_refused_and_nothing_is_written(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        split(JobSpec(sweep="lr=1,2,3,4"), max_array_size=3)
    assert err.value.field == "sweep" and "limit of 3" in str(err.value)
    seeds = " ".join(str(s) for s in range(1002))  # the shipped profiles: Slurm's 1001
    proc = run_cli(["submit", "-M", "local", "--runtime", "none", "--python", "python3",
                    "--name", "big", "--sweep-seeds", seeds, "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "sweep_seeds: 1002 tasks are more than the cluster's job array size limit of " \
           "1001" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written (and nothing submitted)
    proc = run_cli(["submit", "-M", "local", "--runtime", "none", "--python", "python3",
                    "--sweep-throttle", "2", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 2 and "sweep_throttle: is for a sweep" in proc.stderr


def test_the_arrays_script_runs_each_tasks_chain_at_chunk_1(tmp_path: Path) -> None:
    spec = JobSpec(cluster="local", name="sw", out=str(tmp_path / "sw"), runtime="none",
                   python="python3", sweep_seeds=(4, 6, 8))
    root, specs = split(spec)
    tasks = [(t, resolve(s, Registry().get("local"))) for t, s in specs]
    text = array_script("sw", root, tasks, 2)
    lines = text.splitlines()
    assert "#SBATCH --array=0-2%2" in lines and "#SBATCH --job-name=sw" in lines
    assert f"#SBATCH --output={root}/logs/%x-%A_%a.out" in lines
    assert [ln.strip() for ln in lines if ln.startswith("    ")] == [
        str(root / "seed-4"), str(root / "seed-6"), str(root / "seed-8"),
        "sw-s4", "sw-s6", "sw-s8"]
    assert lines[-1] == 'exec bash "$dir/jobs/chain.sbatch" 1'
    assert array_spec(5, None) == "0-4"


def test_a_tasks_chain_names_it_array_task_until_it_starts() -> None:
    assert parse_ids("1 1311_2\n2 1320\nx 5\n1 1_\n") == [(1, "1311_2"), (2, "1320")]
    events = parse_events("100 0 1311_2 cancelled by-user\n101 1 1312 started 0 0 0\n")
    assert [e["job_id"] for e in events] == ["1311_2", "1312"]


def _chain(task: int, state: str, chunks: list[tuple[int, str, str]],
           done: int | None = None) -> dict[str, object]:
    return {"task": task, "label": str(4 + 2 * task), "value": str(4 + 2 * task),
            "state": state, "run_dir": f"runs/sw/seed-{4 + 2 * task}", "done": done,
            "total": 30 if done is not None else None, "chunks_used": len(chunks),
            "chunks": [{"chunk": c, "job_id": j, "state": s} for c, j, s in chunks]}


def test_status_is_one_line_per_sweep_and_one_per_task_with_tasks() -> None:
    chains = [_chain(0, "running", [(1, "11", "COMPLETED"), (2, "15", "RUNNING")], 12),
              _chain(1, "running", [(1, "12", "RUNNING"), (2, "16", "PENDING")], 4),
              _chain(2, "pending", [(1, "10_2", "PENDING")]),
              _chain(3, "pending", [(1, "10_3", "PENDING")])]
    st = {"name": "sw", "chains": chains, "counts": {"running": 2, "pending": 2},
          "array_job": "10", "throttle": 2, "chunks_run": 3, "done": 16, "total": 60,
          "flag": "seeds"}
    lines = format_sweep_status(st)
    assert lines[0] == ("sweep sw: 4 tasks  running 2, pending 2  (array job 10, at most 2 "
                        "at once; 3 chunks run; done 16/60)")
    assert len(lines) == 2 and "--tasks" in lines[1]
    lines = format_sweep_status(st, tasks=True)
    assert lines[0].startswith("sweep sw: 4 tasks") and len(lines) == 5
    assert lines[1] == ("  task 0 (seed 4): running, chunk 2 job 15 RUNNING; done 12/30  "
                        "runs/sw/seed-4")
    assert lines[2].startswith("  task 1 (seed 6): running, chunk 1 job 12 RUNNING")
    assert lines[3].startswith("  task 2 (seed 8): pending, chunk 1 job 10_2 PENDING")
    st["flag"] = "lr"
    assert "task 3 (lr=10): pending" in format_sweep_status(st, tasks=True)[4]


def test_a_value_sweeps_summary_names_the_flag_and_its_values() -> None:
    from train.client.slurm.sweepsummary import SeedResult, format_table

    lines = format_table("lr", [SeedResult("1e-3", 30, 4.0, "complete"),
                                SeedResult("5e-4", 30, 6.0, "complete")], "lr")
    assert lines[0] == "lr: sweep of 2 values of --lr"
    assert lines[1].split() == ["lr", "episodes", "final", "eval", "state"]
    assert lines[2].split() == ["1e-3", "30", "4", "complete"]
    assert "final evaluation over 2 of 2 seed(s): 5 +- 1.414" in lines[4]


def _task_spec(tmp_path: Path, **kw: object) -> JobSpec:
    return JobSpec(cluster="local", name="sw", out=str(tmp_path / "sw"), runtime="none",
                   python="python3", sweep_seeds=(4, 6), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "requeue"), [
    ({}, False), (dict(sweep_throttle=2), True), (dict(requeue=True), True),
    (dict(requeue=True, sweep_throttle=1), True)])
def test_a_throttled_sweeps_tasks_run_in_requeue_mode(
        tmp_path: Path, kw: dict[str, object], requeue: bool) -> None:
    root, specs = split(_task_spec(tmp_path, **kw))
    assert [s.requeue for _, s in specs] == [requeue, requeue]
    tasks = [(t, resolve(s, Registry().get("local"))) for t, s in specs]
    text = render(tasks[0][1])
    assert ("#SBATCH --requeue" in text.splitlines()) is requeue
    assert job_record(tasks[0][1])["requeue"] is requeue
    array = array_script("sw", root, tasks, kw.get("sweep_throttle"))  # type: ignore[arg-type]
    assert ("throttle bounds every chunk of every task" in array) is requeue


@pytest.mark.parametrize(("ids", "restarts"), [("1 700_3\n", "0"), ("1 700\n", "1")])
def test_an_array_task_requeues_itself_by_its_array_name_and_keeps_its_job_id(
        tmp_path: Path, ids: str, restarts: str) -> None:
    """The last task of an array has the array's own job id (700 here): `scontrol requeue
    700` would requeue every task of the sweep. The task requeues 700_3, in its first run
    (chain.ids names it 700_3 until it starts) as in a later one."""
    from tests.unit.test_chain_engine import _calls, _ids, _run

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "chain.ids").write_text(ids)
    proc = _run(tmp_path, "progress", REQUEUE="1", REQUEUE_ALLOWED="1", extra_env={
        "SLURM_JOB_ID": "700", "SLURM_ARRAY_JOB_ID": "700", "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_RESTART_COUNT": restarts})
    assert proc.returncode == 0, proc.stderr
    assert _calls(tmp_path, "scontrol") == ["requeue 700_3"]
    assert _ids(tmp_path) == "1 700\n"
    assert _calls(tmp_path, "sbatch") == []


def test_a_tasks_job_record_holds_its_identity(tmp_path: Path) -> None:
    _, specs = split(_task_spec(tmp_path))
    from train.client.slurm.sweep import task_job

    records = [job_record(task_job(t, resolve(s, Registry().get("local")))) for t, s in specs]
    assert [r["sweep_task"] for r in records] == [{"index": 0, "value": "4"},
                                                  {"index": 1, "value": "6"}]
    single = resolve(JobSpec(cluster="local", name="one", out=str(tmp_path / "one"),
                             runtime="none", python="python3"), Registry().get("local"))
    assert job_record(single)["sweep_task"] is None
