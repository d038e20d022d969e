"""Placeholders where they are put in, and where nothing puts them in (issue 38): a
sweep's {value}, {index} and {task_dir} in --resume-args as one argument each, inside a
{newest:GLOB}, refused in a job that is no sweep; {newest:GLOB} refused outside
--resume-args; a placeholder written with doubled braces passed as its letters."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.golden.cases import script_array, script_step
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.sweep import split
from train.common.errors import ConfigError

COMMAND = dict(cluster="local", name="c", entry="command", runtime="none", python="python3",
               cpus_per_task=1, mem="1000M", stop_mode="kill", max_chunks=2)
BASE = ["render", "--name", "r", "--cluster", "local", "--runtime", "none", "--python",
        sys.executable, "--entry", "command"]


@pytest.mark.parametrize("written", ["--tag '{value}'", '--tag "{value}"', "--tag {value}",
                                     "'--tag={value}'"])
def test_a_quoted_value_in_resume_args_is_one_argument_as_given(
        tmp_path: Path, written: str) -> None:
    values = ["a b", "it's", 'say "hi"', "$(x);y"]
    spec = JobSpec(**COMMAND, out=str(tmp_path / "c"), sweep="tag=" + ",".join(values),
                   resume_args=written, workload=("python3", "fit.py", "--tag", "{value}"))
    _root, specs = split(spec)
    joined = "=" in written
    for value, (_task, task_spec) in zip(values, specs, strict=True):
        expected = (f"--tag={value}",) if joined else ("--tag", value)
        assert task_spec.resume_argv == expected, (written, value)


def test_a_value_that_holds_a_newest_placeholder_never_becomes_a_glob(
        tmp_path: Path) -> None:
    spec = JobSpec(**COMMAND, out=str(tmp_path / "c"), sweep="tag={newest:*},b",
                   workload=("python3", "fit.py", "--tag", "{value}"))
    _root, specs = split(spec)
    assert specs[0][1].workload[-1] == "{newest:*}"  # the command's own: plain text
    spec = JobSpec(**COMMAND, out=str(tmp_path / "c"), sweep="tag={newest:*},b",
                   resume_args="--tag {value}", workload=("python3", "fit.py"))
    with pytest.raises(ConfigError) as err:  # --resume-args: the chain would expand it
        split(spec)
    assert err.value.field == "sweep" and "{newest:*}" in str(err.value)


def test_each_task_resumes_from_its_own_newest_save(tmp_path: Path) -> None:
    spec = JobSpec(**COMMAND, out=str(tmp_path / "c"), sweep="lr=1,2",
                   resume_args="--resume_from_checkpoint {newest:{task_dir}/out/ckpt-*}",
                   workload=("python3", "fit.py", "--lr", "{value}", "--output_dir",
                             "{task_dir}/out"))
    root, specs = split(spec)
    assert [s.resume_argv for _, s in specs] == [
        ("--resume_from_checkpoint", f"{{newest:{root}/task-{i}/out/ckpt-*}}")
        for i in (0, 1)]
    # the adaptation that can never match: every task looks in the same out/
    shared = JobSpec(**{**COMMAND, "out": str(tmp_path / "c")}, sweep="lr=1,2",
                     resume_args="--resume_from_checkpoint {newest:out/ckpt-*}",
                     workload=spec.workload)
    with pytest.raises(ConfigError) as err:
        split(shared)
    assert err.value.field == "resume_args" and "{newest:{task_dir}/out/ckpt-*}" in str(
        err.value)
    # a folder a glob would read as a pattern cannot go into one as plain text
    odd = JobSpec(**{**COMMAND, "out": str(tmp_path / "c[1]")}, sweep="lr=1,2",
                  resume_args=spec.resume_args, workload=spec.workload)
    with pytest.raises(ConfigError, match="plain text"):
        split(odd)


def test_the_chain_finds_each_tasks_own_newest_save(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from train.batch.saves import expand
    from train.client.clusters.profiles import Registry
    from train.client.slurm.render import job_record
    from train.client.slurm.resolve import resolve

    monkeypatch.chdir(tmp_path)  # where the tasks run
    spec = JobSpec(**COMMAND, out=str(tmp_path / "c"), sweep="lr=1,2",
                   resume_args="--resume_from_checkpoint {newest:{task_dir}/out/ckpt-*}",
                   workload=("python3", "fit.py", "--output_dir", "{task_dir}/out"))
    root, specs = split(spec)
    (tmp_path / "out" / "ckpt-9").mkdir(parents=True)  # no task's
    for i, step in ((0, 5), (1, 7)):
        (root / f"task-{i}" / "out" / f"ckpt-{step}").mkdir(parents=True)
    # what the chain engine reads of each task's job, expanded as it expands it
    records = [job_record(resolve(s, Registry().get("local"))) for _, s in specs]
    assert [expand(r["resume_args"], r["program_dir"]) for r in records] == [
        (["--resume_from_checkpoint", str(root / f"task-{i}" / "out" / f"ckpt-{step}")], "")
        for i, step in ((0, 5), (1, 7))]


@pytest.mark.parametrize(("flags", "field", "words"), [
    (["--", "python3", "x.py", "--resume", "{newest:out/*}"], "workload", "--resume-args"),
    (["--save-path", "{newest:out/*}", "--", "python3", "x.py"], "save_path",
     "--resume-args"),
    (["--", "python3", "x.py", "--lr", "{value}"], "workload", "sweep"),
    (["--", "python3", "x.py", "--i={index}"], "workload", "sweep"),
    (["--", "python3", "x.py", "--out", "{task_dir}/o"], "workload", "sweep"),
    (["--resume-args", "--tag {value}", "--", "python3", "x.py"], "resume_args", "sweep"),
    (["--resume-args", "--r {newest:{task_dir}/o/*}", "--", "python3", "x.py"],
     "resume_args", "sweep"),
    (["--save-path", "{task_dir}/o", "--", "python3", "x.py"], "save_path", "sweep"),
])
def test_a_placeholder_where_nothing_replaces_it_is_refused(
        tmp_path: Path, flags: list[str], field: str, words: str) -> None:
    (tmp_path / "x.py").write_text("")
    proc = run_cli([*BASE, "--stop-mode", "kill", "--max-chunks", "2", *flags],
                   cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"{field}:" in proc.stderr and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_a_placeholder_with_doubled_braces_is_its_letters(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")
    proc = run_cli([*BASE, "--stop-mode", "kill", "--max-chunks", "2", "--resume-args",
                    "--tag {{value}} --r {newest:out/*}", "--", "python3", "x.py",
                    "--fmt", "{{value}}-{{index}}", "--cfg", '{"a": {"b": 1}}',
                    "--g", "{{newest:out/*}}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert script_step(proc.stdout)[-6:] == ["--fmt", "{value}-{index}", "--cfg",
                                             '{"a": {"b": 1}}', "--g", "{newest:out/*}"]
    assert script_array(proc.stdout, "RESUME_ARGS") == ["--tag", "{value}", "--r",
                                                        "{newest:out/*}"]
    # in a sweep: put in as its letters, never replaced
    spec = JobSpec(**COMMAND, out=str(tmp_path / "c"), sweep="lr=1,2",
                   workload=("python3", "x.py", "--lr", "{value}", "{{value}}"))
    assert split(spec)[1][1][1].workload[-2:] == ("2", "{value}")
    # the chain expands every {newest:...} of --resume-args: no plain text there
    proc = run_cli([*BASE, "--stop-mode", "kill", "--max-chunks", "2", "--resume-args",
                    "--g {{newest:out/*}}", "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 2 and "resume_args" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["optimizer.lr", "X", "weight_decay", "_p"])
def test_a_command_sweeps_name_is_any_label_the_message_promises(
        tmp_path: Path, name: str) -> None:
    from train.client.slurm.sweep import swept_flag

    spec = JobSpec(**COMMAND, out=str(tmp_path / "c"), sweep=f" {name} =1,2",
                   workload=("python3", "fit.py", "{value}"))
    assert swept_flag(spec) == name  # as written, the spaces around it dropped


@pytest.mark.parametrize(("entry", "sweep"), [("command", "9lr=1,2"), ("command", "a b=1,2"),
                                              ("command", ".x=1,2"), ("train", "X=1,2"),
                                              ("train", "optimizer.lr=1,2")])
def test_a_sweep_name_outside_the_rule_is_refused_saying_the_rule(
        entry: str, sweep: str) -> None:
    workload = ("python3", "fit.py", "{value}") if entry == "command" else ("demo",)
    spec = JobSpec(**{**COMMAND, "entry": entry}, sweep=sweep, workload=workload)
    with pytest.raises(ConfigError) as err:
        split(spec)
    assert err.value.field == "sweep" and "spaces around NAME" in str(err.value)
    assert "any name" not in str(err.value)


@pytest.mark.parametrize("sweep", ["lr=[1,2]", "lr=[1e-3, 5e-4]", "lr= [0.1]"])
def test_a_bracketed_list_of_values_is_refused_with_the_fix(sweep: str) -> None:
    spec = JobSpec(**COMMAND, sweep=sweep, workload=("python3", "fit.py", "{value}"))
    with pytest.raises(ConfigError) as err:
        split(spec)
    fix = sweep.replace("[", "").replace("]", "").replace("= ", "=")
    assert err.value.field == "sweep" and f"write {fix}" in str(err.value), str(err.value)


def test_a_command_sweep_recorded_with_its_old_spelling_goes_on_in_its_folders(
        tmp_path: Path) -> None:
    from train.client.slurm.sweep import SweepTask, write_record

    root = tmp_path / "c"
    write_record(root, "c", [SweepTask(0, "1", None, "task-0")], "my-lr")  # ('_' was '-')
    spec = JobSpec(**COMMAND, out=str(root), sweep="my_lr=2,1",
                   workload=("python3", "fit.py", "{value}"))
    assert [t.dir for t, _ in split(spec)[1]] == ["task-1", "task-0"]


@pytest.mark.parametrize(("field", "given"), [
    ("out", "runs/{value}"), ("sbatch_extra", ("--comment={value}",)),
    ("srun_extra", ("--output={task_dir}/o",)), ("image", "/img/{index}.sif"),
    ("env", ("CKPT={newest:out/*}",)), ("sbatch_extra", ("--comment={newest:x}",))])
def test_a_placeholder_in_any_other_field_is_refused_naming_it(
        tmp_path: Path, field: str, given: object) -> None:
    """--out, --sbatch-extra, --srun-extra, --image (and {newest:GLOB} in --env) took a
    placeholder as its letters without a word: a folder named {value}, Slurm's options."""
    from train.client.slurm.sweepargs import single_job

    where = {"out": str(tmp_path / "c")} if field != "out" else {}
    sweep = JobSpec(**COMMAND, **where, sweep="lr=1,2", **{field: given},
                    workload=("python3", "fit.py", "--lr", "{value}"))
    single = JobSpec(**COMMAND, **where, **{field: given}, workload=("python3", "fit.py"))
    for check in (lambda: split(sweep), lambda: single_job(single)):
        with pytest.raises(ConfigError) as err:
            check()
        assert err.value.field == field, str(err.value)
        assert ("TRAIN_SWEEP_VALUE" if "newest" not in str(given) else "--resume-args") \
            in str(err.value)
    flag = f"--{field.replace('_', '-')}={given if isinstance(given, str) else given[0]}"
    proc = run_cli([*BASE, flag, "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 2 and f"error: {field}:" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_each_task_run_in_its_own_folder_resumes_from_a_relative_newest_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--chdir {task_dir} runs each task in its own folder: {newest:out/ckpt-*} there is
    each task's own, and was refused as "the same place for every task"; --output_dir out
    was warned as shared, and the chain as saving nowhere it looks."""
    from train.batch.saves import expand
    from train.client.clusters.profiles import Registry
    from train.client.slurm.render import job_record
    from train.client.slurm.resolve import resolve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fit.py").write_text("")
    spec = JobSpec(**COMMAND, out=str(tmp_path / "c"), sweep="lr=1,2", chdir="{task_dir}",
                   resume_args="--resume_from_checkpoint {newest:out/ckpt-*}",
                   workload=("python3", str(tmp_path / "fit.py"), "--lr", "{value}",
                             "--output_dir", "{task_dir}/out"))
    root, specs = split(spec)
    for i, step in ((0, 5), (1, 7)):
        (root / f"task-{i}" / "out" / f"ckpt-{step}").mkdir(parents=True)
    records = [job_record(resolve(s, Registry().get("local"))) for _, s in specs]
    # (relative, as the program in its own folder takes it)
    assert [r["program_dir"] for r in records] == [str(root / "task-0"), str(root / "task-1")]
    assert [expand(r["resume_args"], r["program_dir"])[0] for r in records] == [
        ["--resume_from_checkpoint", "out/ckpt-5"], ["--resume_from_checkpoint", "out/ckpt-7"]]
    proc = run_cli([*BASE, "--stop-mode", "kill", "--max-chunks", "2", "--sweep", "lr=1,2",
                    "--chdir", "{task_dir}", "--resume-args", "--resume {newest:out/ckpt-*}",
                    "--", "python3", str(tmp_path / "fit.py"), "--lr", "{value}",
                    "--output_dir", "out"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr, proc.stderr


def test_a_command_sweeps_value_given_twice_names_its_label_not_a_flag() -> None:
    """'the values must differ: '1' and '1' is given twice of --optimizer.lr': a command
    sweep's NAME is a label, no flag of the program."""
    spec = JobSpec(**COMMAND, sweep="optimizer.lr=1, 1", workload=("python3", "f.py", "{value}"))
    with pytest.raises(ConfigError) as err:
        split(spec)
    assert str(err.value).endswith("'1' and '1' are given twice of optimizer.lr"), str(err.value)
