"""--stop-mode, --resume-args and --save-path (issue 25, item 3): what the job spec takes
and refuses, what the rendered script carries, and where a resubmitted chain starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.golden.cases import script_array, script_step
from train.batch import contract
from train.client.slurm.chain import Chain
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.submission import first_chunk
from train.common.errors import ConfigError

BASE = ["render", "--name", "r", "--cluster", "local", "--runtime", "none", "--python",
        sys.executable, "--entry", "command"]


def test_resume_args_take_a_flag_as_their_value_and_render_as_anscript_array(
        tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")
    (tmp_path / "work").mkdir()
    proc = run_cli([*BASE, "--stop-mode", "kill", "--resume-args", "--init_from=resume",
                    "--save-path", "out", "--save-path", "/abs/ckpt.pt", "--max-chunks", "3",
                    "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert script_array(script, "RESUME_ARGS") == ["--init_from=resume"]
    assert script_array(script, "SAVE_PATHS") == [str(tmp_path / "out"), "/abs/ckpt.pt"]
    assert "stop_mode=kill" in script and "stop_signal=TERM" in script
    assert "--signal=B:USR1@" in script  # the batch shell gets the margin's signal
    # relative save paths are from --chdir, where the program runs; quoting as a shell's
    proc = run_cli([*BASE, "--chdir", "work", "--resume-args", "--resume 'a b'",
                    "--save-path", "out", "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert script_array(proc.stdout, "RESUME_ARGS") == ["--resume", "a b"]
    assert script_array(proc.stdout, "SAVE_PATHS") == [str(tmp_path / "work" / "out")]
    assert "stop_mode=signal" in proc.stdout


@pytest.mark.parametrize(("flags", "field", "words"), [
    (["--stop-mode", "kill", "--stop-signal", "USR1"], "stop_mode", "cannot go with it"),
    (["--stop-mode", "kill", "--stop-signal", "none"], "stop_mode", "cannot go with it"),
    (["--stop-mode", "halt"], "stop_mode", "signal, kill"),
    (["--resume-args", "'unclosed"], "resume_args", "No closing quotation"),
    (["--resume-args", " "], "resume_args", "empty"),
])
def test_bad_values_are_refused_by_name_and_nothing_is_written(
        tmp_path: Path, flags: list[str], field: str, words: str) -> None:
    (tmp_path / "x.py").write_text("")
    proc = run_cli([*BASE, *flags, "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and words in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_resume_args_are_not_for_train_run() -> None:
    with pytest.raises(ConfigError, match=r"resume_args.*resumes from its checkpoint"):
        JobSpec(resume_args="--resume")


def test_kill_mode_chains_a_command_that_has_no_stop_signal_of_its_own() -> None:
    # a command without a stop signal runs as one chunk; with the tool's kill it chains
    # (as long as asked: a command is one chunk unless --max-chunks or --total-time)
    assert JobSpec(entry="command", workload=("python3", "x.py")).chunks == 1
    spec = JobSpec(entry="command", workload=("python3", "x.py"), stop_mode="kill",
                   max_chunks=3)
    assert spec.stop == "TERM" and spec.chunks == 3
    assert spec.resume_argv == ()
    with pytest.raises(ConfigError, match="max_chunks"):
        JobSpec(entry="command", workload=("python3", "x.py"), max_chunks=3)


def test_kill_mode_is_taken_under_torchs_launcher(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("import torch\n")
    proc = run_cli([*BASE, "--nodes", "2", "--launch", "torchrun", "--stop-mode", "kill",
                    "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli([*BASE, "--nodes", "2", "--launch", "torchrun", "--stop-signal", "TERM",
                    "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 2 and "stop_signal" in proc.stderr  # (as before)


def _chain(run_dir: Path, ids: list[tuple[int, str]], events: str) -> Chain:
    (run_dir / contract.CHAIN_EVENTS).write_text(events)
    return Chain(run_dir, {"name": "r"}, ids)


def test_a_new_chain_goes_on_counting_after_a_stop_before_any_save(tmp_path: Path) -> None:
    assert first_chunk(None) == 1
    ended = ("1700000000 1 11 started 0 0 0\n1700000001 1 11 extended 12\n"
             "1700000050 1 11 stopped 0 0\n1700000060 2 12 started 0 0 0\n"
             "1700000061 2 12 extended 13\n")
    unsaved = _chain(tmp_path, [(1, "11"), (2, "12"), (3, "13")],
                     ended + "1700000100 2 12 unsaved 0 0\n")
    assert first_chunk(unsaved) == 3
    # another chain's events in the same file do not count, nor an earlier unsaved stop
    # followed by a checkpointed one
    other = _chain(tmp_path, [(1, "21")], ended + "1700000100 2 12 unsaved 0 0\n"
                   "1700000200 1 21 started 0 0 0\n1700000250 1 21 stopped 5 10\n")
    assert first_chunk(other) == 1
    complete = _chain(tmp_path, [(1, "11"), (2, "12")],
                      ended + "1700000100 2 12 complete 10 10\n")
    assert first_chunk(complete) == 1


def test_a_newest_placeholder_renders_as_given_and_a_malformed_one_is_refused(
        tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")
    (tmp_path / "work").mkdir()
    proc = run_cli([*BASE, "--chdir", "work", "--resume-args",
                    "--resume_from_checkpoint {newest:out/checkpoint-*} ckpt_path={newest:$x/*}",
                    "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert script_array(proc.stdout, "RESUME_ARGS") == [
        "--resume_from_checkpoint", "{newest:out/checkpoint-*}", "ckpt_path={newest:$x/*}"]
    assert f"\n#   program dir: {tmp_path / 'work'} (" in proc.stdout  # where GLOB is from
    for bad, words in [("--r {newest:out/c-*", "not closed"), ("--r {newest:}", "no path"),
                       ("--r {newest}", "{newest:GLOB}"), ("--r {newest:a{b}", "brace"),
                       ("--r {NEWEST:out/*}", "{newest:GLOB}"),
                       ("--r={Newest:out/*}", "{newest:GLOB}")]:
        proc = run_cli([*BASE, "--resume-args", bad, "--", "python3", "x.py"], cwd=tmp_path)
        assert proc.returncode == 2, (bad, proc.stderr)
        assert "resume_args" in proc.stderr and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_save_path_of_the_whole_file_system_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")
    depth = len(tmp_path.parts) - 1  # '..' as many times as reaches /
    for given in ("/", "//", "/".join([".."] * depth)):
        proc = run_cli([*BASE, "--stop-mode", "kill", "--max-chunks", "2", "--save-path",
                        given, "--", "python3", "x.py"], cwd=tmp_path)
        assert proc.returncode == 2 and "save_path" in proc.stderr \
            and "whole file system" in proc.stderr, (given, proc.stderr)
    assert not (tmp_path / "runs").exists()


def test_a_save_path_in_the_container_is_looked_at_on_the_host_at_its_binds_source(
        tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")
    (tmp_path / "ck").mkdir()
    (tmp_path / "img.sif").write_text("")
    container = [*BASE[:5], "--runtime", "apptainer", "--image", str(tmp_path / "img.sif"),
                 "--entry", "command", "--no-check", "--stop-mode", "kill", "--max-chunks",
                 "2", "--bind", f"{tmp_path / 'ck'}:/ckpts"]
    proc = run_cli([*container, "--save-path", "/ckpts", "--save-path", "/ckpts/a/b.pt",
                    "--save-path", "/elsewhere", "--resume-args", "--from /ckpts/last.pt",
                    "--", "python3", "x.py", "--save_dir", "/ckpts"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert script_array(proc.stdout, "SAVE_PATHS") == [
        str(tmp_path / "ck"), str(tmp_path / "ck" / "a" / "b.pt"), "/elsewhere"]
    # the program still gets the container's paths
    assert script_array(proc.stdout, "RESUME_ARGS") == ["--from", "/ckpts/last.pt"]
    assert script_step(proc.stdout)[-2:] == ["--save_dir", "/ckpts"]
    # a container's path under no bind, absent on the host: saved there, seen by no chain
    assert "--save-path /ckpts" not in proc.stderr
    assert "--save-path /elsewhere: the apptainer container shares no folder" in proc.stderr \
        and "--bind SRC:/elsewhere" in proc.stderr, proc.stderr
    # {newest:GLOB} there: the chain would glob the host's /ckpts, the program needs the
    # container's; refused with the fix
    proc = run_cli([*container, "--resume-args", "--from {newest:/ckpts/*.pt}", "--",
                    "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "resume_args" in proc.stderr and "--bind SRC" in proc.stderr and \
        f"{{newest:{tmp_path / 'ck'}/*.pt}}" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()
