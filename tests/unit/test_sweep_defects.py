"""A sweep's defects as its user met them, each with stand-ins for Slurm's commands (a
unit test: no cluster): a single chain over a sweep's task folder, task folders bound to
their values, Slurm that cannot be reached, values equal as their flag reads them, a
damaged sweep.json, an unreadable task folder, a missing task's logs, a resubmission's
chunk count and an array submission whose sbatch reply was lost."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

# SLURM_MODE: pending (the array's tasks wait), ended (Slurm knows no job), down (neither
# squeue nor sacct answers). sbatch hands out 7001, 7002, ... (the count in $STUB_COUNT).
SLURM = {
    "sbatch": '#!/bin/bash\nn=$(( $(cat "$STUB_COUNT" 2>/dev/null || echo 7000) + 1 ))\n'
              'echo "$n" > "$STUB_COUNT"\necho "$n"\n',
    "scontrol": "#!/bin/bash\nexit 0\n",
    "squeue": '#!/bin/bash\n'
              'if [ "$SLURM_MODE" = down ]; then\n'
              '  echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2\n'
              '  exit 1\nfi\n'
              'case "$*" in\n'
              '  *--array*) [ "$SLURM_MODE" = pending ] && for i in 0 1 2; do\n'
              '      echo "$(cat "$STUB_COUNT")_$i|PENDING|None"; done ;;\n'
              '  *--json*) echo \'{"jobs": []}\' ;;\n'
              '  *%o*) cat "$QUEUE" 2>/dev/null ;;\n'
              'esac\nexit 0\n',
    "sacct": '#!/bin/bash\n'
             'if [ "$SLURM_MODE" = down ]; then\n'
             '  echo "sacct: error: Problem talking to the database: Connection refused" >&2\n'
             '  exit 1\nfi\nexit 0\n',
    "scancel": '#!/bin/bash\necho "$@" >> "$SCANCELLED"\n',
}


def _slurm(tmp_path: Path, mode: str = "pending") -> dict[str, str]:
    sbin = tmp_path / "sbin"
    sbin.mkdir(exist_ok=True)
    for name, text in SLURM.items():
        (sbin / name).write_text(text)
        (sbin / name).chmod(0o755)
    return {"PATH": f"{sbin}:{os.environ['PATH']}", "SLURM_MODE": mode,
            "STUB_COUNT": str(tmp_path / "sbatch_n"), "QUEUE": str(tmp_path / "queue"),
            "SCANCELLED": str(tmp_path / "scancelled")}


def _submit(tmp_path: Path, env: dict[str, str], values: str = "x=1,2",
            *extra: str) -> None:
    proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "sw",
                    "--entry", "command", "--runtime", "none", "--python", sys.executable,
                    "--sweep", values, *extra, "--", "true"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr


def _cancelled(tmp_path: Path) -> list[str]:
    path = tmp_path / "scancelled"
    return path.read_text().split() if path.exists() else []


def _no_traceback(proc: object) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr  # type: ignore[attr-defined]


# -- a single chain over a sweep's task folder ------------------------------------------
def test_a_chain_into_a_queued_sweeps_task_folder_is_refused(tmp_path: Path) -> None:
    env = _slurm(tmp_path)
    _submit(tmp_path, env)
    task = tmp_path / "runs" / "sw" / "task-1"
    script = (task / "jobs" / "chain.sbatch").read_text()
    for out in (task, tmp_path / "moved"):
        if out.name == "moved":  # a task's folder moved out of its sweep: still a sweep's
            (tmp_path / "moved").mkdir()
            (tmp_path / "moved" / "chain.json").write_text((task / "chain.json").read_text())
        proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "other",
                        "--out", str(out), "--entry", "command", "--runtime", "none",
                        "--python", sys.executable, "--", "false"], cwd=tmp_path, env=env)
        assert proc.returncode == 2, proc.stderr
        assert str(out) in proc.stderr and "sweep" in proc.stderr, proc.stderr
    assert f"sweep {tmp_path / 'runs' / 'sw'}" in run_cli(
        ["submit", "--cluster", "local", "--no-check", "--out", str(task), "--entry",
         "command", "--runtime", "none", "--python", sys.executable, "--", "false"],
        cwd=tmp_path, env=env).stderr
    assert (task / "jobs" / "chain.sbatch").read_text() == script
    assert json.loads((task / "chain.json").read_text())["name"] == "sw-t1"


# -- each task folder is bound to its value ----------------------------------------------
def _values(root: Path) -> dict[str, str]:
    """Each task folder's value, as its chain's script gives it to the command."""
    out = {}
    for task in sorted(root.glob("task-*")):
        text = (task / "jobs" / "chain.sbatch").read_text()
        line = next(ln for ln in text.splitlines() if "TRAIN_SWEEP_VALUE" in ln)
        out[task.name] = line.split("TRAIN_SWEEP_VALUE=", 1)[1].split()[0].strip("'\"")
    return out


def test_a_resubmitted_sweep_keeps_each_value_in_its_own_folder(tmp_path: Path) -> None:
    env = _slurm(tmp_path, "ended")
    _submit(tmp_path, env, "x=a,b")
    root = tmp_path / "runs" / "sw"
    (root / "task-0" / "checkpoint-of-a").write_text("a")
    assert _values(root) == {"task-0": "a", "task-1": "b"}
    _submit(tmp_path, env, "x=c,b,a")  # another order, and a new value
    assert _values(root) == {"task-0": "a", "task-1": "b", "task-2": "c"}
    record = json.loads((root / "sweep.json").read_text())
    assert [(c["index"], c["value"], c["dir"]) for c in record["chains"]] == [
        (0, "c", "task-2"), (1, "b", "task-1"), (2, "a", "task-0")]
    assert record["folders"] == {"task-0": "a", "task-1": "b", "task-2": "c"}
    array = (root / "jobs" / "array.sbatch").read_text().split("TASK_DIRS=(")[1]
    assert array.split(")")[0].split() == [str(root / d) for d in ("task-2", "task-1",
                                                                    "task-0")]
    assert (root / "jobs" / "array-7001.sbatch").is_file()  # the earlier array's, kept
    _submit(tmp_path, env, "x=b")  # a value left out keeps its folder for later
    _submit(tmp_path, env, "x=a,d")
    assert _values(root)["task-0"] == "a" and _values(root)["task-3"] == "d"


# -- Slurm that cannot be reached ---------------------------------------------------------
def test_a_sweep_whose_slurm_cannot_be_reached_is_an_error_not_ended(
        tmp_path: Path) -> None:
    _submit(tmp_path, _slurm(tmp_path))
    env = _slurm(tmp_path, "down")
    for command in (["status", "sw"], ["status", "sw", "--tasks"], ["cancel", "sw"]):
        proc = run_cli(command, cwd=tmp_path, env=env)
        assert proc.returncode != 0, (command, proc.stdout)
        assert "cannot reach Slurm: squeue: squeue: error: Unable to contact" in \
            proc.stderr, proc.stderr
        assert "ended" not in proc.stdout and "no active jobs" not in proc.stdout
        assert len(proc.stderr) < 1000
        _no_traceback(proc)
    assert _cancelled(tmp_path) == []
    # and a sweep whose array Slurm still has cannot be replaced while it cannot say so
    proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "sw", "--entry",
                    "command", "--runtime", "none", "--python", sys.executable, "--sweep",
                    "x=1,2", "--", "true"], cwd=tmp_path, env=env)
    assert proc.returncode != 0 and "cannot reach Slurm" in proc.stderr, proc.stderr


def test_cancel_reaches_the_array_task_of_a_task_whose_chain_names_no_job(
        tmp_path: Path) -> None:
    env = _slurm(tmp_path)
    _submit(tmp_path, env)
    (tmp_path / "runs" / "sw" / "task-1" / "chain.ids").write_text("")
    st = json.loads(run_cli(["status", "sw", "--json"], cwd=tmp_path, env=env).stdout)
    assert [c["state"] for c in st["chains"]] == ["pending", "pending"], st
    proc = run_cli(["cancel", "sw"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(_cancelled(tmp_path)) == ["7001_0", "7001_1"]


@pytest.mark.parametrize("array", [7001, "", ["7001"], "7001; rm"])
def test_an_array_job_of_the_wrong_type_is_said_as_a_damaged_record(
        tmp_path: Path, array: object) -> None:
    """It was ignored unsaid: the sweep shown as separate chains, and the array task of a
    task whose chain cannot be read left queued without a word."""
    env = _slurm(tmp_path)
    _submit(tmp_path, env)
    path = tmp_path / "runs" / "sw" / "sweep.json"
    record = json.loads(path.read_text())
    record["array_job"] = array
    path.write_text(json.dumps(record))
    said = f"runs/sw/sweep.json: array_job {array!r} is not a job id"
    proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "sw",
                    "--entry", "command", "--runtime", "none", "--python", sys.executable,
                    "--sweep", "x=1,2", "--", "true"], cwd=tmp_path,
                   env={**env, "SLURM_MODE": "ended"})  # (as if its tasks had ended)
    assert proc.returncode == 2 and f"name: {tmp_path}/{said}" in proc.stderr, proc.stderr
    (tmp_path / "runs" / "sw" / "task-1" / "chain.json").write_text('{"name": ')
    proc = run_cli(["status", "sw"], cwd=tmp_path, env=env)
    _no_traceback(proc)
    assert proc.returncode == 0 and said in proc.stdout, proc.stdout
    assert "the record is damaged" in proc.stdout and "separate chains" not in proc.stdout
    proc = run_cli(["cancel", "sw"], cwd=tmp_path, env=env)
    _no_traceback(proc)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert _cancelled(tmp_path) == ["7001_0"]  # (task 1's array task: not known from it)


def test_a_damaged_array_job_is_said_once_and_never_counted_as_a_task(
        tmp_path: Path) -> None:
    """A sweep of 2 tasks with a damaged array_job was 'sweep sw: 3 tasks  pending 2,
    unreadable 1' (the record's damage counted as a task, and as the sweep's state)."""
    env = _slurm(tmp_path)
    _submit(tmp_path, env)
    path = tmp_path / "runs" / "sw" / "sweep.json"
    record = json.loads(path.read_text())
    record["array_job"] = [7001]
    path.write_text(json.dumps(record))
    proc = run_cli(["status", "sw", "--tasks"], cwd=tmp_path, env=env)
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("sweep sw: 2 tasks  ") and "unreadable" not in lines[0], lines
    assert "array job unknown: the record is damaged" in lines[0], lines
    said = [ln for ln in lines if "array_job [7001] is not a job id" in ln]
    assert len(said) == 1 and said[0].startswith("  unreadable: "), lines
    assert sum(ln.startswith("  task ") for ln in lines) == 2, lines
    # a task that cannot be read then: cancel cannot know that nothing is active
    (tmp_path / "runs" / "sw" / "task-1" / "chain.json").write_text('{"name": ')
    proc = run_cli(["cancel", "sw"], cwd=tmp_path, env={**env, "SLURM_MODE": "ended"})
    assert proc.returncode == 2 and "no active jobs" not in proc.stdout, proc.stdout
    assert "no active job among what could be read" in proc.stdout, proc.stdout


# -- values equal as the flag reads them ----------------------------------------------------
def test_values_equal_as_the_flags_type_are_duplicates(tmp_path: Path) -> None:
    from train.client.slurm.jobspec import JobSpec
    from train.client.slurm.sweep import split
    from train.common.errors import ConfigError

    for values in ("1e-3,0.001", "0.5,5e-1,1"):
        with pytest.raises(ConfigError) as err:
            split(JobSpec(cluster="local", sweep=f"lr={values}", workload=("demo",)))
        first, second = values.split(",")[:2]
        assert err.value.field == "sweep" and repr(first) in str(err.value) and \
            repr(second) in str(err.value)
    with pytest.raises(ConfigError, match="'3' and '03'"):  # an int flag too
        split(JobSpec(cluster="local", sweep="episodes=3,03", workload=("demo",)))
    # a command sees the text itself: those differ
    split(JobSpec(cluster="local", entry="command", sweep="x=1e-3,0.001",
                  workload=("true",)))
    proc = run_cli(["submit", "--cluster", "local", "--no-check", "--runtime", "none",
                    "--python", sys.executable, "--sweep", "lr=1e-3,0.001", "--", "demo"],
                   cwd=tmp_path, env=_slurm(tmp_path))
    assert proc.returncode == 2 and "'1e-3' and '0.001' are the same value of --lr" in \
        proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists() and _cancelled(tmp_path) == []


# -- a damaged sweep.json ----------------------------------------------------------------
@pytest.mark.parametrize(("entry", "said"), [
    ({"index": "x", "dir": "task-0", "value": "1"}, "its index 'x' is not a whole number"),
    ({"index": 1.5, "dir": "task-0", "value": "1"}, "its index 1.5 is not a whole number"),
    ({"index": [0], "dir": "task-0", "value": "1"}, "its index [0] is not a whole number"),
    ({"index": 0, "dir": 7, "value": "1"}, "its dir 7 is not a task folder"),
    ({"index": 0, "dir": "task-0", "value": {"a": 1}}, "its value {'a': 1} is not text"),
    ({}, "its dir None is not a task folder"),
    (5, "is not an object (int)"),
])
def test_a_damaged_entry_of_sweep_json_is_named_and_the_rest_go_on(
        tmp_path: Path, entry: object, said: str) -> None:
    env = _slurm(tmp_path)
    _submit(tmp_path, env)
    path = tmp_path / "runs" / "sw" / "sweep.json"
    record = json.loads(path.read_text())
    record["chains"][0] = entry
    record.update(name=5, flag=7, throttle="x")  # wrong types around them too
    path.write_text(json.dumps(record))
    where = f"runs/sw/sweep.json: chain 1: {said}"
    proc = run_cli(["status", "sw", "--tasks"], cwd=tmp_path, env=env)
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert any(ln.startswith(f"  unreadable: {where}") for ln in proc.stdout.splitlines()), \
        proc.stdout
    assert "  task 1 (" in proc.stdout and "pending" in proc.stdout
    proc = run_cli(["summary", "sw"], cwd=tmp_path, env=env)
    _no_traceback(proc)
    assert proc.returncode == 2 and where in proc.stderr, proc.stderr
    assert "sweep of 1 seed(s)" in proc.stdout  # the rest is summarised
    proc = run_cli(["cancel", "sw"], cwd=tmp_path, env=env)
    _no_traceback(proc)
    assert proc.returncode == 2 and where in proc.stderr, proc.stderr
    assert _cancelled(tmp_path) == ["7001_1"]


@pytest.mark.parametrize("text", ['[1]', '{"chains": 5}', '{', '"x"'])
def test_a_sweep_json_that_is_no_record_is_said_without_a_traceback(
        tmp_path: Path, text: str) -> None:
    env = _slurm(tmp_path)
    _submit(tmp_path, env)
    (tmp_path / "runs" / "sw" / "sweep.json").write_text(text)
    for command in ("status", "cancel", "summary"):
        proc = run_cli([command, "runs/sw"], cwd=tmp_path, env=env)
        _no_traceback(proc)
        assert proc.returncode == 2 and "sweep.json" in proc.stderr, (command, proc.stderr)


def test_a_sweep_json_that_is_a_fifo_is_said_and_no_other_sweeps_tasks_are_listed(
        tmp_path: Path) -> None:
    """A FIFO at runs/sw/sweep.json hid the sweep: `train status sw` answered "no run
    named 'sw'; known runs: task-0, task-1" (another sweep's tasks, named as runs) and the
    listings passed sw over. Records are read from regular files only, never blocking."""
    env = _slurm(tmp_path)
    _submit(tmp_path, env)
    proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "other",
                    "--entry", "command", "--runtime", "none", "--python", sys.executable,
                    "--sweep", "y=1,2", "--", "true"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    record = tmp_path / "runs" / "sw" / "sweep.json"
    record.unlink()
    os.mkfifo(record)
    said = "run: runs/sw/sweep.json is a FIFO, not the record `train submit` writes"
    for command in ("status", "cancel", "summary", "logs"):
        proc = run_cli([command, "sw"], cwd=tmp_path, env=env, timeout=60)
        _no_traceback(proc)
        assert proc.returncode == 2 and said in proc.stderr, (command, proc.stderr)
        assert "sw/task-0, sw/task-1" in proc.stderr and "other" not in proc.stderr
    proc = run_cli(["status"], cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 0 and f"sw: unreadable  runs/sw\n  {said}" in proc.stdout, \
        proc.stdout
    proc = run_cli(["status", "--all"], cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 0 and said in proc.stdout, proc.stdout
    # submitted again over it, as a sweep or a single chain: refused, the FIFO left alone
    for sweep in (["--sweep", "x=1,2"], []):
        proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "sw",
                        "--entry", "command", "--runtime", "none", "--python",
                        sys.executable, *sweep, "--", "true"], cwd=tmp_path,
                       env={**env, "SLURM_MODE": "ended"}, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert f"name: {record} is a FIFO" in proc.stderr and \
            "choose another --name" in proc.stderr, proc.stderr
        assert record.is_fifo() and not (record.parent / "chain.json").exists()
    # a sweep's chain is named with its sweep where a name is not found
    proc = run_cli(["status", "nosuch"], cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 2 and "known runs: other/task-0, other/task-1" in proc.stderr, \
        proc.stderr


def test_a_summary_of_huge_values_says_so_instead_of_overflowing(tmp_path: Path) -> None:
    import csv

    from tests.unit.test_sweep import _sweep_on_disk

    root = tmp_path / "runs" / "e1"
    _sweep_on_disk(root, {4: [1e308, 1.7e308, 1.7e308], 6: [-1.7e308, 1.7e308, 1e308]},
                   {4: 1.7e308, 6: -1.7e308})
    proc = run_cli(["summary", "e1", "--smooth", "2"], cwd=tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.lower()
    assert "inf" not in out and "nan" not in out, proc.stdout
    assert "final evaluation over 2 of 2 seed(s): 0 +- too large (over 1.8e308)" in \
        proc.stdout, proc.stdout
    rows = list(csv.DictReader((root / "summary.csv").open()))
    cells = [v for r in rows for v in r.values()]
    assert not any(c.lower() in ("inf", "-inf", "nan") for c in cells), rows
    # moving averages of 2: (1e308 + 1.7e308) / 2 and (-1.7e308 + 1.7e308) / 2
    assert float(rows[0]["mean_reward"]) == pytest.approx(1.35e308 / 2)
    assert float(rows[0]["std_reward"]) == pytest.approx(1.35e308 / 2)
    assert "no plot: the curves' mean +- std reaches 1e+300 or more" in proc.stderr
    from train.client.slurm.sweepsummary import _write_csv, mean_std

    assert mean_std([1e308, 1e308]) == (1e308, 0.0)
    notes: list[str] = []
    _write_csv(root, [1], [float("inf")], [1.0], [2], notes)
    assert (root / "summary.csv").read_text().splitlines()[1] == "1,,1,2"
    assert "1 mean or std value(s) too large for a float" in notes[0]


# -- an unreadable task folder, a missing task -----------------------------------------------
def test_one_unreadable_task_folder_leaves_the_others_status(tmp_path: Path) -> None:
    env = _slurm(tmp_path)
    _submit(tmp_path, env, "x=1,2,3")
    (tmp_path / "runs" / "sw" / "task-1" / "chain.json").write_text('{"name": ')
    proc = run_cli(["status", "sw", "--tasks"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("sweep sw: 3 tasks  unreadable 1, pending 2") or \
        lines[0].startswith("sweep sw: 3 tasks  pending 2, unreadable 1"), lines
    assert lines[1].startswith("  time: waited ")  # (the readable tasks' together)
    assert lines[2].startswith("  task 0 (x=1): pending, chunk 1 job 7001_0 PENDING")
    assert lines[3].startswith("  task 1 (x=2): unreadable: run: ") and \
        "task-1/chain.json is not valid JSON" in lines[3], lines
    assert lines[4].startswith("  task 2 (x=3): pending")
    proc = run_cli(["status", "sw"], cwd=tmp_path, env=env)  # the short form says it too
    assert proc.returncode == 0 and "task 1 (x=2): unreadable" in proc.stdout
    assert run_cli(["status", "sw/task-1"], cwd=tmp_path, env=env).returncode == 2


def test_logs_of_a_missing_task_name_only_that_sweeps_tasks(tmp_path: Path) -> None:
    env = _slurm(tmp_path)
    _submit(tmp_path, env, "x=" + ",".join(map(str, range(12))))
    proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "other",
                    "--entry", "command", "--runtime", "none", "--python", sys.executable,
                    "--sweep", "y=1,2", "--", "true"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(["logs", "sw/task-99"], cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "the sweep 'sw' has no task 'task-99'; its tasks: sw/task-0, sw/task-1, " in \
        proc.stderr and "sw/task-9 and 2 more" in proc.stderr, proc.stderr
    assert "other" not in proc.stderr and len(proc.stderr) < 400, proc.stderr


# -- a resubmission's chunk count; the array's lost sbatch reply -------------------------
def test_a_resubmitted_task_goes_on_counting_its_chunks(tmp_path: Path) -> None:
    env = _slurm(tmp_path, "ended")
    _submit(tmp_path, env)
    task = tmp_path / "runs" / "sw" / "task-0"
    (task / "chain.ids").write_text("1 7001_0\n2 7005\n")
    (task / "chain.events").write_text("100 1 7005 started 0 10 0\n"
                                       "200 2 7005 unsaved 3 10\n")
    _submit(tmp_path, env)
    assert (task / "chain.ids").read_text() == "3 7002_0\n"
    assert json.loads((task / "chain.json").read_text())["first_chunk"] == 3
    assert (task.parent / "task-1" / "chain.ids").read_text() == "1 7002_1\n"
    array = (task.parent / "jobs" / "array.sbatch").read_text().splitlines()
    assert array[-3:] == ["TASK_FIRST=(3 1)", "first=${TASK_FIRST[$SLURM_ARRAY_TASK_ID]}",
                          'exec bash "$dir/jobs/chain.sbatch" "$first" "$first"']


LOST_REPLY = """#!/bin/bash
while [ "${1#-}" != "$1" ]; do shift; done
echo "7001_[0-1] $*" >> "$QUEUE"
echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2
exit 1
"""


def test_an_arrays_lost_sbatch_reply_leaves_no_held_array(tmp_path: Path) -> None:
    env = _slurm(tmp_path)
    (tmp_path / "sbin" / "sbatch").write_text(LOST_REPLY)
    (tmp_path / "queue").write_text("4100 /elsewhere/other.sh\n")
    proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "sw",
                    "--entry", "command", "--runtime", "none", "--python", sys.executable,
                    "--sweep", "x=1,2", "--", "true"], cwd=tmp_path, env=env)
    assert proc.returncode != 0 and "Socket timed out" in proc.stderr, proc.stderr
    assert _cancelled(tmp_path) == ["7001"], proc.stderr
    assert not (tmp_path / "runs").exists()


def test_slurm_that_cannot_be_reached_is_quoted_without_its_terminal_escapes(
        tmp_path: Path) -> None:
    from train.common._proc import ProcError

    err = ProcError(["sbatch"], 1, "x" * 100_000 + "\x1b]0;title\x07\x1b[31mred\x1b[0m\n")
    assert "\x1b" not in str(err) and str(err).endswith("red"), str(err)[-80:]
    env = _slurm(tmp_path)
    _submit(tmp_path, env)
    for name in ("squeue", "sacct"):
        stub = tmp_path / "sbin" / name
        stub.write_text("#!/bin/bash\nprintf '\\x1b]0;title\\x07\\x1b[2J\\x1b[31mdown\\n' >&2\n"
                        "exit 1\n")
    for command in (["status", "sw"], ["cancel", "sw"]):
        proc = run_cli(command, cwd=tmp_path, env=env)
        assert proc.returncode != 0 and "cannot reach Slurm: squeue: down" in proc.stderr, \
            proc.stderr
        assert "\x1b" not in proc.stderr, repr(proc.stderr)
