"""Sweeps of any program (`--entry command`): the task's value, index and folder put into
the command where the user marks them ({value}, {index}, {task_dir}), what is refused or
warned when they are missing, and `train summary` of a command sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden.cases import script_step
from train.client.clusters.profiles import Registry
from train.client.slurm.job import JobSpec, resolve
from train.client.slurm.render import library_text, render
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
    text = render(resolve(second, Registry().get("local")), library_text())
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
    assert len(notes) == 2
    assert "same command" in notes[0] and "{value}" in notes[0]
    assert "--output_dir out" in notes[1] and "{task_dir}" in notes[1]
    assert sweep_notes(("python3", "fit.py", "--lr", "{value}",
                        "--output-dir={task_dir}/o"), None, str(tmp_path)) == []
    (tmp_path / "fit.py").write_text("import os\nlr = os.environ['TRAIN_SWEEP_VALUE']\n")
    assert sweep_notes(("python3", "fit.py"), None, str(tmp_path)) == []
