"""Sweeps of any program (`--entry command`): the task's value, index and folder put into
the command where the user marks them ({value}, {index}, {task_dir}), what is refused or
warned when they are missing, and `train summary` of a command sweep."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.golden.cases import script_step
from train.client.clusters.profiles import Registry
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import render
from train.client.slurm.resolve import resolve
from train.client.slurm.sweep import split
from train.client.slurm.sweepargs import sweep_notes
from train.common.errors import ConfigError

COMMAND = dict(cluster="local", name="c", entry="command", runtime="none", python="python3",
               cpus_per_task=1, mem="1000M")


def test_the_markers_are_each_tasks_value_index_and_folder(tmp_path: Path) -> None:
    spec = JobSpec(**COMMAND, out=str(tmp_path / "c"), sweep="lr=1e-3,a b;$(x)",
                   stop_mode="kill", max_chunks=3, save_path=("{task_dir}/ckpt",),
                   resume_args="--resume {task_dir}/ckpt --tag {value}",
                   workload=("python3", "fit.py", "--lr={value}", "--task", "{index}",
                             "--output_dir", "{task_dir}"))
    root, specs = split(spec)
    second = specs[1][1]
    folder = str(root / "task-1")
    assert second.workload == ("python3", "fit.py", "--lr=a b;$(x)", "--task", "1",
                               "--output_dir", folder)
    assert second.save_path == (f"{folder}/ckpt",)
    assert second.resume_argv == ("--resume", f"{folder}/ckpt", "--tag", "a b;$(x)")
    # plain text in the task's script: the step's argv holds the value as it is, never
    # read by a shell
    text = render(resolve(second, Registry().get("local")))
    assert script_step(text)[-7:] == list(second.workload)
    first = specs[0][1]
    assert first.workload[2] == "--lr=1e-3" and first.workload[-1] == str(root / "task-0")


def test_a_seed_sweep_of_a_command_gets_the_seed_as_its_value(tmp_path: Path) -> None:
    spec = JobSpec(**COMMAND, out=str(tmp_path / "s"), sweep_seeds=(4, 6),
                   workload=("python3", "fit.py", "--seed", "{value}"))
    _root, specs = split(spec)
    assert [s.workload[-1] for _, s in specs] == ["4", "6"]


@pytest.mark.parametrize("arg", ["$TRAIN_SWEEP_VALUE", "--lr=${TRAIN_SWEEP_VALUE}",
                                 "$TRAIN_RUN_DIR/out"])
def test_a_shell_variable_among_the_arguments_is_refused_naming_the_marker(
        arg: str) -> None:
    spec = JobSpec(**COMMAND, sweep="lr=1,2", workload=("python3", "fit.py", arg))
    with pytest.raises(ConfigError) as err:
        split(spec)
    assert err.value.field == "workload"
    assert "{value}" in str(err.value) or "{task_dir}" in str(err.value)
    # a shell that expands it is the user's choice
    spec = JobSpec(**COMMAND, sweep="lr=1,2",
                   workload=("bash", "-c", f"python3 fit.py {arg}"))
    assert len(split(spec)[1]) == 2


def test_a_sweep_whose_tasks_all_run_alike_or_share_an_output_folder_is_warned(
        tmp_path: Path) -> None:
    (tmp_path / "fit.py").write_text("print('hi')\n")
    notes = sweep_notes(("python3", "fit.py", "--output_dir", "out"), None, str(tmp_path))
    assert len(notes) == 3
    assert f"all run in {tmp_path}" in notes[0] and "--chdir {task_dir}" in notes[0]
    assert "same command" in notes[1] and "{value}" in notes[1]
    assert "--output_dir out" in notes[2] and "{task_dir}" in notes[2]
    assert sweep_notes(("python3", "fit.py", "--lr", "{value}",
                        "--output-dir={task_dir}/o"), None, str(tmp_path)) == []
    # {task_dir} makes the commands differ, not what they train: said so, not "the same"
    notes = sweep_notes(("python3", "fit.py", "--output-dir={task_dir}/o"), None,
                        str(tmp_path))
    assert len(notes) == 1 and "differ only in {task_dir}" in notes[0]
    assert "same command" not in notes[0] and "--lr {value}" in notes[0]
    (tmp_path / "fit.py").write_text("import os\nlr = os.environ['TRAIN_SWEEP_VALUE']\n"
                                     "out = os.environ['TRAIN_RUN_DIR']\n")
    assert sweep_notes(("python3", "fit.py"), None, str(tmp_path)) == []
    # each task in its own folder
    assert sweep_notes(("python3", str(tmp_path / "fit.py")), None, "{task_dir}") == []


def test_a_sweep_run_in_each_tasks_folder_is_not_called_the_same_command(
        tmp_path: Path) -> None:
    """--chdir {task_dir} makes the tasks run apart as much as an argument with {task_dir}
    does; the warning said 'every task runs the same command' there."""
    (tmp_path / "fit.py").write_text("print('hi')\n")
    notes = sweep_notes(("python3", str(tmp_path / "fit.py")), None, "{task_dir}")
    assert len(notes) == 1 and "differ only in {task_dir}" in notes[0], notes
    assert "same command" not in notes[0], notes


# -- train summary of a command's sweep ---------------------------------------------------

def _command_sweep(root: Path, flag: str, values: list[str]) -> list[Path]:
    from train.client.slurm.sweep import SweepTask, write_record

    seeds = flag == "seeds"
    tasks = [SweepTask(i, v, int(v) if seeds else None, f"seed-{v}" if seeds else f"task-{i}")
             for i, v in enumerate(values)]
    write_record(root, "c", tasks, flag)
    dirs = []
    for t in tasks:
        (root / t.dir).mkdir(parents=True)
        (root / t.dir / "chain.json").write_text('{"entry": "command"}')
        dirs.append(root / t.dir)
    return dirs


def test_summary_of_a_command_sweep_reads_each_tasks_final_metrics(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from train.cli import main
    from train.client.slurm.sweepmetrics import is_command_sweep, summarize_metrics

    root = tmp_path / "runs" / "c"
    a, b, c, d = _command_sweep(root, "seeds", ["1", "2", "3", "4"])
    (a / "metrics.json").write_text('{"eval_loss": 0.5, "accuracy": 0.8, "name": "x"}')
    (b / "out").mkdir()  # Hugging Face's Trainer, --output_dir {task_dir}/out
    (b / "out" / "all_results.json").write_text('{"eval_loss": 0.7, "accuracy": 0.9}')
    logs = c / "lightning_logs" / "version_0"  # Lightning's CSVLogger: sparse rows
    logs.mkdir(parents=True)
    (logs / "metrics.csv").write_text("epoch,step,train_loss,eval_loss,accuracy\n"
                                      "0,9,1.0,,\n0,9,,0.9,0.7\n1,19,0.8,,\n")
    (d / "metrics.json").write_text("[not json")  # named, not fatal for the rest
    assert is_command_sweep(root)
    lines, notes = summarize_metrics(root, {"1": "complete"})
    text = "\n".join(lines)
    assert "eval_loss" in lines[1] and "accuracy" in lines[1] and "train_loss" in lines[1]
    assert lines[1].split()[1:4] == ["eval_loss", "train_loss", "accuracy"], lines[1]
    assert [ln.split()[:4] for ln in lines[2:6]] == [
        ["1", "0.5", "-", "0.8"], ["2", "0.7", "-", "0.9"], ["3", "0.9", "0.8", "0.7"],
        ["4", "-", "-", "-"]]
    assert lines[2].endswith("complete") and lines[5].endswith("incomplete")
    assert "eval_loss over 3 of 4 seed(s): 0.7 +- 0.2" in text, text
    assert "accuracy over 3 of 4 seed(s): 0.8 +- 0.1" in text, text
    assert "name" not in lines[1]  # numbers only
    assert any(str(d / "metrics.json") in n for n in notes)
    # the command prints the same table (where Slurm cannot be asked: the folders' states)
    monkeypatch.chdir(tmp_path)
    assert main(["summary", "c"]) == 0
    out = capsys.readouterr().out
    assert "episodes" not in out and "eval_loss over 3 of 4 seed(s)" in out


# Hugging Face's run_clm.py with --do_train --do_eval: its all_results.json, keys sorted
RUN_CLM = {"epoch": 3.0, "eval_accuracy": 0.41, "eval_loss": 3.1, "eval_runtime": 12.5,
           "eval_samples": 240, "eval_samples_per_second": 19.2,
           "eval_steps_per_second": 2.4, "perplexity": 22.2, "total_flos": 1.2e15,
           "train_loss": 3.4, "train_runtime": 900.1, "train_samples": 2318,
           "train_samples_per_second": 7.7, "train_steps_per_second": 0.96}


def test_a_sweeps_table_shows_the_losses_and_the_tasks_metric_first(
        tmp_path: Path) -> None:
    import json

    from train.client.slurm.sweepmetrics import summarize_metrics

    root = tmp_path / "c"
    for i, task in enumerate(_command_sweep(root, "seeds", ["1", "2"])):
        (task / "out").mkdir()
        (task / "out" / "all_results.json").write_text(
            json.dumps({**RUN_CLM, "train_loss": 3.4 + i}))
    lines, notes = summarize_metrics(root)
    header = lines[1].split()
    assert header[1:5] == ["eval_loss", "train_loss", "eval_accuracy", "perplexity"], header
    assert [ln.split()[2] for ln in lines[2:4]] == ["3.4", "4.4"]  # train_loss, per seed
    assert "train_loss over 2 of 2 seed(s): 3.9 +- 0.7071" in "\n".join(lines)
    (left,) = [n for n in notes if "left out of the table" in n]
    assert "6 more metric(s)" in left and "eval_loss" not in left
    assert all(m not in left for m in ("train_loss", "perplexity", "eval_accuracy")), left
    # Lightning's names: its losses first, then its accuracy; what measures the run last
    from train.client.slurm.sweepmetrics import metric_order

    assert metric_order(["lr-Adam", "val_acc", "epoch", "train_loss", "val_loss",
                         "it_per_second", "loss"]) == [
        "train_loss", "loss", "val_loss", "val_acc", "lr-Adam", "epoch", "it_per_second"]


def test_the_note_of_metrics_left_out_names_every_one_it_counts() -> None:
    """run_clm.py's 14 metrics: '6 more metric(s) left out' named 5 of them
    (train_steps_per_second was cut off unsaid)."""
    from train.client.slurm.sweepmetrics import SHOWN, TaskMetrics, format_metrics

    task = TaskMetrics("1", "complete")
    task.values = dict(RUN_CLM)
    _, notes = format_metrics("c", "seeds", [task])
    (left,) = [n for n in notes if "left out of the table" in n]
    assert f"{len(RUN_CLM) - SHOWN} more metric(s)" in left, left
    named = left.split(": ", 1)[1].split(", ")
    assert len(named) == len(RUN_CLM) - SHOWN and "train_steps_per_second" in named, left


def test_summary_help_describes_a_command_sweep_and_the_demos(
        capsys: pytest.CaptureFixture[str]) -> None:
    from train.cli import main

    with pytest.raises(SystemExit):
        main(["summary", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("-e command with --sweep-seeds or --sweep NAME=V1,V2,...",
                  "$TRAIN_METRICS_FILE", "all_results.json", "metrics.csv",
                  "the losses and the task's own metric first", "A `train run` sweep"):
        assert words in text, (words, text)


def test_summary_of_a_value_sweep_without_metrics_says_where_to_write_them(
        tmp_path: Path) -> None:
    from train.client.slurm.sweepmetrics import summarize_metrics

    root = tmp_path / "c"
    _command_sweep(root, "lr", ["0.1", "0.2"])
    lines, _ = summarize_metrics(root)
    assert lines[0] == "c: sweep of 2 values of --lr"
    assert "TRAIN_METRICS_FILE" in lines[-1]


# -- no empty NAME-ARRAY_I.out/.err beside the sweep's logs -----------------------------

def test_an_array_task_removes_the_empty_log_files_slurm_opened_for_it(
        tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from train.batch import contract
    from train.client.slurm.sweeparray import array_script

    spec = JobSpec(**COMMAND, out=str(tmp_path / "sw"), sweep="lr=1,2",
                   workload=("python3", "fit.py", "{value}"))
    root, specs = split(spec)
    tasks = [(t, resolve(s, Registry().get("local"))) for t, s in specs]
    text = array_script("sw", root, tasks, None)
    export = next(ln for ln in text.splitlines() if contract.ARRAY_LOG_VAR in ln)
    logs = root / "logs"
    logs.mkdir(parents=True)
    (logs / "sw-7_1.out").write_text("")  # what Slurm opened, left empty
    (logs / "sw-7_1.err").write_text("slurmstepd: error: *** JOB 8 CANCELLED ***\n")
    (logs / "sw-7_0.out").write_text("")  # another task's: not this one's to remove
    # the chunk's end as the engine does it, in the environment the array's script gives
    # (its export line, run by bash)
    base = subprocess.run(["bash", "-c", f"SLURM_ARRAY_JOB_ID=7; SLURM_ARRAY_TASK_ID=1; "
                           f"{export}; printf %s \"${contract.ARRAY_LOG_VAR}\""],
                          capture_output=True, text=True, check=True, timeout=60).stdout
    ending = ("import sys; from train.batch.chunk import Chunk; "
              "Chunk({'run_dir': sys.argv[1], 'max_chunks': 1, 'walltime_seconds': 60}, 's', 1, "
              "None, []).cleanup()")
    env = {**os.environ, contract.ARRAY_LOG_VAR: base, "SLURM_ARRAY_JOB_ID": "7"}
    subprocess.run([sys.executable, "-c", ending, str(root)], check=True, timeout=60, env=env)
    assert sorted(p.name for p in logs.iterdir()) == ["sw-7_0.out", "sw-7_1.err"]
    # a successor chunk (no array task: Slurm's variables are its own) touches nothing
    (logs / "sw-7_1.out").write_text("")
    del env["SLURM_ARRAY_JOB_ID"]
    subprocess.run([sys.executable, "-c", ending, str(root)], check=True, timeout=60, env=env)
    assert (logs / "sw-7_1.out").exists()


def test_summary_names_a_metrics_file_that_is_no_file_and_survives_odd_numbers_and_names(
        tmp_path: Path) -> None:
    import os

    from train.client.slurm.sweepmetrics import summarize_metrics

    root = tmp_path / "c"
    a, b, c = _command_sweep(root, "seeds", ["1", "2", "3"])
    # an integer too large for a float (JSON allows it) is no metric, not a traceback
    (a / "metrics.json").write_text('{"big": 1' + "0" * 400 + ', "loss": 0.5}')
    os.mkfifo(b / "metrics.json")  # never read (it would block), but named
    # a name with a terminal escape and a line break stays on its line, escape-free
    (c / "metrics.json").write_text('{"lo\\u001b[2Jss\\nx": 0.25}')
    lines, notes = summarize_metrics(root)
    assert [ln.split()[:2] for ln in lines[2:5]] == [["1", "0.5"], ["2", "-"], ["3", "-"]]
    assert "big" not in lines[1]
    assert any(str(b / "metrics.json") in n and "not a regular file" in n for n in notes)
    assert "loss" in lines[1] and "loss x" in lines[1]
    assert all("\x1b" not in ln and "\n" not in ln for ln in lines)


def test_a_value_holding_a_markers_letters_is_put_in_as_written(tmp_path: Path) -> None:
    spec = JobSpec(**COMMAND, out=str(tmp_path / "v"), sweep="tag={index},{task_dir}",
                   workload=("python3", "fit.py", "--tag={value}", "{index}"))
    _root, specs = split(spec)
    assert [s.workload[2:] for _, s in specs] == [("--tag={index}", "0"),
                                                  ("--tag={task_dir}", "1")]


@pytest.mark.parametrize(("field", "given"), [("env", ("LR={value}",)),
                                              ("bind", ("{task_dir}",))])
def test_a_marker_where_none_is_replaced_is_refused_naming_the_field(
        field: str, given: object) -> None:
    spec = JobSpec(**COMMAND, sweep="lr=1,2", **{field: given},
                   workload=("python3", "fit.py", "--lr", "{value}"))
    with pytest.raises(ConfigError) as err:
        split(spec)
    assert err.value.field == field and "TRAIN_SWEEP_VALUE" in str(err.value)


def test_chdir_task_dir_outside_a_commands_sweep_is_refused_with_where_it_works(
        tmp_path: Path) -> None:
    """`--chdir {task_dir}` in a job that is no sweep, or in a demo's sweep, was refused
    with '{task_dir} is replaced only in ... and --chdir', as if it were given there."""
    from tests.conftest import run_cli

    for sweep in ([], ["--sweep-seeds", "1 2"]):
        proc = run_cli(["render", "--cluster", "local", "--runtime", "none", *sweep,
                        "--chdir", "{task_dir}", "--", "demo"], cwd=tmp_path)
        assert proc.returncode == 2 and "error: chdir: '{task_dir}'" in proc.stderr, \
            proc.stderr
        assert "only in the tasks of a command's sweep" in proc.stderr, proc.stderr


def test_a_value_with_a_control_character_is_refused_and_a_damaged_record_named(
        tmp_path: Path) -> None:
    import json

    from train.client.slurm.sweep import read_tasks
    from train.client.slurm.sweepmetrics import summarize_metrics

    for value in ("a\tb", "c\x1b[2J"):
        spec = JobSpec(**COMMAND, sweep=f"lr=1,{value}", workload=("p", "{value}"))
        with pytest.raises(ConfigError) as err:
            split(spec)
        assert err.value.field == "sweep" and "control character" in str(err.value)
    # a record edited by hand: that entry is named, the others go on
    root = tmp_path / "c"
    _command_sweep(root, "lr", ["1", "2"])
    record = json.loads((root / "sweep.json").read_text())
    record["chains"][1]["value"] = "2\x1b[2J\nEVIL"
    (root / "sweep.json").write_text(json.dumps(record))
    tasks, bad = read_tasks(root)
    assert [t.label for t in tasks] == ["1"]
    assert len(bad) == 1 and "chain 2" in bad[0] and "control characters" in bad[0]
    assert all("\x1b" not in ln for ln in summarize_metrics(root)[0])


def test_summary_shows_a_diverged_seeds_nan_or_infinity_and_says_the_mean_leaves_it_out(
        tmp_path: Path) -> None:
    import json

    from train.client.slurm.sweepmetrics import summarize_metrics

    root = tmp_path / "c"
    a, b, c, _ = _command_sweep(root, "seeds", ["1", "2", "3", "4"])
    # what json.dump writes for a diverged loss: NaN, Infinity
    (a / "metrics.json").write_text(json.dumps({"loss": 0.5, "acc": float("nan")}))
    (b / "metrics.json").write_text(json.dumps({"loss": float("nan"),
                                                "acc": float("nan")}))
    (c / "metrics.json").write_text(json.dumps({"loss": float("-inf"),
                                                "acc": float("inf")}))
    lines, _ = summarize_metrics(root)
    text = "\n".join(lines)
    assert lines[1].split()[:3] == ["seed", "loss", "acc"]  # a column of NaN stays
    assert [ln.split()[:3] for ln in lines[2:6]] == [
        ["1", "0.5", "nan"], ["2", "nan", "nan"], ["3", "-inf", "inf"], ["4", "-", "-"]]
    assert "loss over 1 of 4 seed(s): 0.5 (one seed, no spread); left out: nan, -inf" \
        in text, text
    assert "acc: no finite value in 4 seed(s); left out: nan, nan, inf" in text, text


def test_chdir_task_dir_runs_each_task_in_its_own_folder(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Issue 39: a program that saves where it runs (snapshot.pt) shared the submit folder
    with every task; --chdir {task_dir} was refused. The folder need not exist at render:
    submit makes it."""
    from train.client.slurm.render import folder_to_make, save_paths

    monkeypatch.chdir(tmp_path)
    spec = JobSpec(**COMMAND, out=str(tmp_path / "d"), sweep="lr=1,2",
                   chdir="{task_dir}", save_path=("snapshot.pt",), stop_mode="kill",
                   max_chunks=2, workload=("python3", str(tmp_path / "fit.py"), "{value}"))
    root, specs = split(spec)
    for index, (_task, task_spec) in enumerate(specs):
        job = resolve(task_spec, Registry().get("local"))
        folder = root / f"task-{index}"
        assert task_spec.chdir == str(folder) and not folder.exists()
        assert f"--chdir={folder}" in script_step(render(job))
        assert save_paths(job) == [str(folder / "snapshot.pt")]
        assert folder_to_make(job) == folder
    # a folder of the task's own below it is made too; one outside the run folder must exist
    sub = dataclasses.replace(specs[0][1], chdir=str(root / "task-0" / "work"))
    assert folder_to_make(resolve(sub, Registry().get("local"))) == root / "task-0" / "work"
    elsewhere = dataclasses.replace(specs[0][1], chdir=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="nowhere is not a directory") as err:
        render(resolve(elsewhere, Registry().get("local")))
    assert err.value.field == "chdir"


@pytest.mark.parametrize(("save_path", "chdir", "refused"), [
    ("snapshot.pt", None, True),  # every task's in the submit folder
    ("/scratch/me/ckpt", "{task_dir}", True),  # an absolute path is every task's
    ("snapshot.pt", "{task_dir}", False),  # from each task's own folder
    ("{task_dir}/ckpt", None, False),
    ("ckpt-{value}", None, False),
])
def test_a_save_path_every_task_would_share_is_refused(
        save_path: str, chdir: str | None, refused: bool) -> None:
    spec = JobSpec(**COMMAND, sweep="lr=1,2", chdir=chdir, save_path=(save_path,),
                   stop_mode="kill", max_chunks=2, workload=("python3", "/x/fit.py", "{value}"))
    if not refused:
        assert len(split(spec)[1]) == 2
        return
    with pytest.raises(ConfigError) as err:
        split(spec)
    assert err.value.field == "save_path" and "--chdir {task_dir}" in str(err.value)
