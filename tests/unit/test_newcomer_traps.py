"""Traps a newcomer meets with `train render` and `train submit`, each refused or warned
before anything is queued, naming the fix: a program given without --entry command, a stop
signal the program has no handler for, a chain whose saves the chain cannot see, a chain
length worked out by hand (--total-time), one-off command jobs that became chains, and a
defaults file's value reported as if it had been typed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from train.cli import main
from train.client.clusters.profiles import Registry
from train.client.slurm.checks.traps import trap_notes
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.resolve import resolve
from train.common.errors import ConfigError

REG = Registry(environ={})
LOCAL = dict(cluster="local", cpus_per_task=1, mem="1000M", runtime="none",
             python="python3")
RENDER = ["render", "-M", "local", "--runtime", "none", "--python", "python3", "--no-check"]


@pytest.fixture(autouse=True)
def _no_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAIN_DEFAULTS", str(tmp_path / "no-defaults.yaml"))
    monkeypatch.chdir(tmp_path)


def _resolve(**kw: Any) -> Any:
    spec = JobSpec(**{**LOCAL, **kw})
    return resolve(spec, REG.get("local"))


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[Any, str, str]:
    """The exit code (argparse's own exit included), stdout and stderr."""
    try:
        code: Any = main(args)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# -- 5: a program where a `train run` workload goes -------------------------------------

@pytest.mark.parametrize("typed", [
    ["python", "my_train.py"],  # no `--`: argparse took python for the job file
    ["--", "my_train.py"],  # (a bare .py: `python my_train.py` is the fix, not ours to do)
])
def test_a_program_without_entry_command_names_the_fix(
        typed: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli([*RENDER, *typed], capsys)
    assert code == 2
    program = [t for t in typed if t != "--"]
    shown = " ".join(["python", *program] if program[0].endswith(".py") else program)
    assert f"-e command -- {shown}" in err, err
    assert "unrecognized arguments" not in err and "must be one of" not in err
    assert "Traceback" not in err


def test_a_script_given_as_the_job_file_names_the_fix(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli([*RENDER, "my_train.py"], capsys)
    assert code == 2 and "-e command -- python my_train.py" in err, err


def test_a_workload_and_entry_command_are_not_refused(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    code, out, _ = _cli([*RENDER, "--", "demo", "--episodes", "3"], capsys)
    assert code == 0 and 'chunk "$0" "$@" --' in out
    code, out, _ = _cli([*RENDER, "-e", "command", "--", "python", "x.py"], capsys)
    assert code == 0 and "x.py" in out


# -- 6: a stop signal the program has no handler for -----------------------------------

def test_a_stop_signal_without_a_handler_in_the_script_is_warned(tmp_path: Path) -> None:
    (tmp_path / "fit.py").write_text("import time\nprint('training')\n")
    notes = trap_notes(_resolve(entry="command", stop_signal="USR1", time="20:00",
                                workload=("python", "fit.py")))
    said = [n for n in notes if "no handler for SIGUSR1" in n]
    assert said and "exit 138" in said[0] and "signal.signal(signal.SIGUSR1" in said[0]
    # a handler in a module next to it counts; so does Lightning (its SLURM support)
    (tmp_path / "util.py").write_text("import signal\nsignal.signal(signal.SIGUSR1, f)\n")
    notes = trap_notes(_resolve(entry="command", stop_signal="USR1", time="20:00",
                                workload=("python", "fit.py")))
    assert not [n for n in notes if "no handler" in n]
    (tmp_path / "util.py").unlink()
    (tmp_path / "fit.py").write_text("import lightning as L\n")
    assert not [n for n in trap_notes(_resolve(entry="command", stop_signal="USR1",
                                               workload=("python", "fit.py")))
                if "no handler" in n]


def test_the_handler_warning_is_printed_at_render(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "fit.py").write_text("print('training')\n")
    code, _, err = _cli([*RENDER, "-e", "command", "--stop-signal", "TERM", "--",
                         "python", "fit.py"], capsys)
    assert code == 0 and "no handler for SIGTERM" in err and "exit 143" in err, err


# -- 7: a chain whose program saves nowhere the chain looks ----------------------------

def test_a_chained_command_without_a_save_path_is_warned(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import signal\nsignal.signal(signal.SIGUSR1, f)\n"
                                       "torch.save(model, 'out/ckpt.pt')\n")
    kw: dict[str, Any] = dict(entry="command", stop_signal="USR1", time="20:00",
                              max_chunks=4, workload=("python", "train.py"))
    notes = trap_notes(_resolve(**kw))
    assert [n for n in notes if "--save-path" in n and "stopped before any save" in n]
    assert not [n for n in trap_notes(_resolve(**kw, save_path=("out",)))
                if "--save-path" in n]
    assert not [n for n in trap_notes(_resolve(**{**kw, "max_chunks": 1}))
                if "--save-path" in n]  # one chunk: nothing to continue
    (tmp_path / "train.py").write_text("import os, signal\nsignal.signal(signal.SIGUSR1, f)\n"
                                       "d = os.environ['TRAIN_RUN_DIR']\n")
    assert not [n for n in trap_notes(_resolve(**kw)) if "--save-path" in n]


def test_resume_args_on_a_one_chunk_command_are_warned() -> None:
    notes = trap_notes(_resolve(entry="command", stop_mode="kill", save_path=("out",),
                                resume_args="--init_from=resume",
                                workload=("python", "train.py")))
    assert [n for n in notes if "--resume-args is for a chain" in n and "--total-time" in n]


# -- 8: --total-time, and one chunk unless a chain is asked for -------------------------

def test_total_time_sets_the_chunks_from_the_walltime_rounded_up() -> None:
    job = _resolve(time="25:00", total_time="2:00:00", workload=("demo",))
    assert job.chunks == 5  # 120 / 25 = 4.8
    assert _resolve(time="20:00", total_time="1:00:00", workload=("demo",)).chunks == 3
    job = _resolve(entry="command", stop_signal="USR1", time="30:00", total_time="1-00:00:00",
                   workload=("python", "x.py"))
    assert job.chunks == 48


@pytest.mark.parametrize(("kw", "message"), [
    (dict(total_time="2:00:00", max_chunks=4), "not both"),
    (dict(total_time="two days"), "is not a SLURM time"),
    (dict(total_time="0"), "more than 0"),
    (dict(time="1:00", total_time="1000-00:00:00"), "over the bound"),
    (dict(total_time="-1"), "is not a SLURM time"),
    (dict(total_time="1:2:3:4"), "is not a SLURM time"),
    (dict(time="1:00:00", total_time="99999-00:00:00"), "over the bound"),
    # a command's chain with no stop signal: said of the flag given, not of --max-chunks
    (dict(entry="command", time="1:00:00", total_time="5:00:00"), "no stop signal"),
])
def test_bad_total_times_are_refused(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _resolve(**{"workload": ("python", "x.py") if kw.get("entry") else ("demo",), **kw})
    assert err.value.field == "total_time" and message in str(err.value), str(err.value)


def test_a_chain_with_no_stop_signal_is_told_of_stop_mode_kill_too() -> None:
    """`-- accelerate launch ...` with --max-chunks 2 was told to give --stop-signal USR1
    (or TERM), both refused for it (it dies of either); the docs' way, --stop-mode kill
    with the program's own saves, went unsaid (and fits any program that saves itself)."""
    for workload in (("python", "x.py"), ("accelerate", "launch", "x.py")):
        with pytest.raises(ConfigError) as err:
            _resolve(entry="command", max_chunks=2, workload=workload)
        assert err.value.field == "max_chunks", str(err.value)
        assert "--stop-mode kill --save-path" in str(err.value), str(err.value)
    # TERM under its node's launcher: not the USR1 or --launch tasks it is refused with
    with pytest.raises(ConfigError) as err:
        _resolve(entry="command", max_chunks=2, stop_signal="TERM", nodes=2,
                 workload=("accelerate", "launch", "x.py"))
    assert err.value.field == "stop_signal" and "--stop-mode kill" in str(err.value)
    assert "--launch tasks" not in str(err.value), str(err.value)


def test_a_command_with_a_stop_signal_alone_is_one_chunk() -> None:
    job = _resolve(entry="command", stop_signal="USR1", workload=("python", "x.py"))
    assert job.chunks == 1
    assert _resolve(entry="command", stop_signal="USR1", max_chunks=3,
                    workload=("python", "x.py")).chunks == 3
    assert _resolve(workload=("demo",)).chunks == 10  # `train run` chains by default


# -- 9: a value from the defaults file --------------------------------------------------

def test_a_bad_default_is_said_as_the_defaults_files(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text("partition: gpu\n")
    monkeypatch.setenv("TRAIN_DEFAULTS", str(defaults))
    code, _, err = _cli(["render", "-M", "gilbreth", "-A", "lab", "--no-check", "--",
                         "demo"], capsys)
    assert code == 2 and "unknown partition 'gpu'" in err, err
    assert f"defaults file {defaults}" in err and "--partition" in err, err
    # typed, it is the user's own: no word of the file
    code, _, err = _cli(["render", "-M", "gilbreth", "-A", "lab", "-p", "gpu", "--no-check",
                         "--", "demo"], capsys)
    assert code == 2 and "unknown partition 'gpu'" in err and "defaults file" not in err


@pytest.mark.parametrize("path", ["/", "//", "/./", "/.."])
def test_a_save_path_of_the_whole_file_system_is_refused(path: str) -> None:
    """Each chunk's end looks through its save paths with find: / would be all of it."""
    with pytest.raises(ConfigError) as err:
        _resolve(entry="command", stop_mode="kill", save_path=(path,),
                 workload=("python", "x.py"))
    assert err.value.field == "save_path" and "whole file system" in str(err.value)


def test_a_bad_list_item_from_the_defaults_file_is_said_as_the_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text("bind: [':']\n")
    monkeypatch.setenv("TRAIN_DEFAULTS", str(defaults))
    code, _, err = _cli([*RENDER, "-e", "command", "--", "python", "x.py"], capsys)
    assert code == 2 and "bind: ':' is not SRC" in err, err
    # a list flag adds to the file's list: the item is removed from the file
    assert f"defaults file {defaults}" in err and "remove the item" in err, err


def test_an_apptainer_setting_passed_through_by_name_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    # the batch script unsets the submitting shell's APPTAINER_*/SINGULARITY_*: a name
    # passed through would be silently lost
    for name in ("SINGULARITY_BIND", "APPTAINER_CACHEDIR"):
        code, _, err = _cli([*RENDER, "-e", "command", "--env", name, "--", "python",
                             "x.py"], capsys)
        assert code == 2 and f"env: {name}" in err and "--bind" in err, err


@pytest.mark.parametrize("typed", [["python", "x.py", "--lr", "3"], ["./run.sh"],
                                   ["torchrun", "--nproc-per-node", "2", "x.py"]])
def test_a_program_after_the_dashes_runs_as_a_command_without_entry(
        typed: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`-e command` is what a program after `--` means: it is taken so when no --entry
    is given (a flag, the job file or the defaults); an explicit -e train still refuses."""
    code, out, err = _cli([*RENDER, "--", *typed], capsys)
    assert code == 0, err
    assert " ".join(typed) in out and 'chunk "$0" "$@" --' in out
    assert "entry=command" in out, out[:2000]
    code, _, err = _cli([*RENDER, "-e", "train", "--", *typed], capsys)
    assert code == 2 and "-e command --" in err, err


@pytest.mark.parametrize("args", [["init", "--partition", "debug"], ["init", "--show"]])
def test_a_defaults_path_too_long_to_open_is_exit_2_naming_it(
        args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """ENAMETOOLONG from the defaults path (TRAIN_DEFAULTS), not a traceback."""
    monkeypatch.setenv("TRAIN_DEFAULTS", str(tmp_path / ("d" * 300) / "defaults.yaml"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "cannot read the defaults file" in err and "TRAIN_DEFAULTS" in err, err
