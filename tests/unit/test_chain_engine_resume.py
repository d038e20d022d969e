"""The chain engine's resume side (stub Slurm commands, as in test_chain_engine.py):
--resume-args with {newest:GLOB} expanded at each chunk's start, the progress that the
Hugging Face Trainer's trainer_state.json and Lightning's checkpoint names show, a chunk
that started over from zero, and a step that runs into the walltime after the stop signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.conftest import spawn_group
from tests.unit.test_chain_engine import (
    SKIP_STEP_FILES,
    _calls,
    _env,
    _events,
    _kinds,
    _script,
    _wait_started,
)
from train.batch import contract

# The step: writes its arguments (one a line); on USR1 (the stop signal) saves out/model.bin
# or, where STEP_SAVES is set, out/checkpoint-N/trainer_state.json as the Trainer does, N = the step it
# resumed from (its --resume_from_checkpoint folder's global_step, else 0) + STEP_SAVES;
# exits 0. STEP_IGNORES_USR1: it carries on (an evaluation after training) until ended.
TRAINER = r"""#!/bin/bash
printf '%s\n' "$@" > "$RUN_DIR/step.args"
start=0
if [ "${1:-}" = --resume_from_checkpoint ]; then
    start=$(sed -n 's/^  "global_step": \([0-9]*\),*$/\1/p' "$2/trainer_state.json")
fi
save() {
    mkdir -p "$PWD/out"
    if [ -z "${STEP_SAVES:-}" ]; then echo w > "$PWD/out/model.bin"; exit 0; fi
    n=$((start + STEP_SAVES))
    mkdir -p "$PWD/out/checkpoint-$n"
    printf '{\n  "epoch": 1.0,\n  "global_step": %s,\n  "log_history": [\n    {\n      "step": %s\n    }\n  ],\n  "max_steps": 30\n}\n' \
        "$n" "$n" > "$PWD/out/checkpoint-$n/trainer_state.json"
    exit 0
}
if [ -n "${STEP_IGNORES_USR1:-}" ]; then trap '' USR1; else trap save USR1; fi
echo $$ > "$RUN_DIR/step.pid"
touch "$RUN_DIR/step.ready"
while :; do sleep 0.02; done
"""


def _state(folder: Path, step: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps(
        {"best_global_step": 999, "global_step": step, "log_history": [{"step": step}],
         "max_steps": 30}, indent=2, sort_keys=True))


def _chunk(tmp_path: Path, chunk: str = "1", step_env: dict[str, str] | None = None,
           **values: str) -> subprocess.Popen[str]:
    """A chunk of a program run in tmp_path/work (PROGRAM_DIR), once its step runs."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    script = _script(tmp_path, COMPLETE_ON_SUCCESS="1", STEP_GRACE="0",
                     SAVE_SKIP=SKIP_STEP_FILES, PROGRAM_DIR=str(work), **values)
    (tmp_path / "step.sh").write_text(TRAINER)
    for name in ("step.ready", "step.args", "step.pid"):
        (tmp_path / "run" / name).unlink(missing_ok=True)
    env = {**_env(tmp_path), **(step_env or {})}
    proc = spawn_group(["bash", str(script), chunk], env=env, cwd=work)
    _wait_started(tmp_path, proc)
    return proc


def _stopped(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGUSR1)  # the walltime signal, at the margin
    _, err = proc.communicate(timeout=60)
    return err


def _args(tmp_path: Path) -> list[str]:
    text = (tmp_path / "run" / "step.args").read_text()
    return [] if text == "\n" else text.splitlines()  # (printf's line for no arguments)


RESUME = "--resume_from_checkpoint\n{newest:out/checkpoint-*}"


def test_newest_is_the_highest_numbered_complete_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "work" / "out"
    for n in (9, 10, 100):
        _state(out / f"checkpoint-{n}", n)
    (out / "checkpoint-100" / "trainer_state.json").unlink()  # a save cut short
    (out / "checkpoint-11").mkdir()  # ...and one begun
    _state(out / "checkpoint-9", 9)  # written last: the number counts, not the time
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / contract.SAVED_MARKER).write_text("1 400 0\n")
    err = _stopped(_chunk(tmp_path, "2", {"STEP_SAVES": "5"}, ARRAY_RESUME_ARGS=RESUME))
    assert _args(tmp_path) == ["--resume_from_checkpoint", "out/checkpoint-10"], err
    assert "arguments end with --resume_from_checkpoint out/checkpoint-10" in err
    assert _kinds(tmp_path) == ["started", "extended", "stopped"]
    # the progress the saves show, at the start and after the stop
    assert _events(tmp_path)[0][3] == "0 10 30" and _events(tmp_path)[-1][3] == "15 30"
    assert "checkpointed stop (at 15/30); the next chunk goes on from it" in err


def test_a_placeholder_inside_a_word_takes_the_newest_file_by_time_where_names_differ(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "work" / "ckpt"
    ckpt.mkdir(parents=True)
    for i, name in enumerate(("epoch=0-step=9.ckpt", "last.ckpt", "epoch=1-step=20.ckpt")):
        (ckpt / name).write_text("x")
        os.utime(ckpt / name, (1_700_000_000 + i, 1_700_000_000 + i))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / contract.SAVED_MARKER).write_text("1 400 0\n")
    err = _stopped(_chunk(tmp_path, "2", ARRAY_RESUME_ARGS="fit\nckpt_path={newest:ckpt/*.ckpt}"))
    assert _args(tmp_path) == ["fit", "ckpt_path=ckpt/epoch=1-step=20.ckpt"], err
    # the step in Lightning's name is the progress (of a total it does not name)
    assert _events(tmp_path)[0][3] == "0 20 0"


def test_the_resume_args_are_left_out_whole_while_nothing_matches(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / contract.SAVED_MARKER).write_text("1 400 0\n")
    err = _stopped(_chunk(tmp_path, "2", {"STEP_SAVES": "5"}, ARRAY_RESUME_ARGS=RESUME))
    assert _args(tmp_path) == [], err
    assert "resume arguments are left out: nothing matches out/checkpoint-*" in err
    # it saved checkpoint-5 on the stop: the next chunk goes on from it
    assert _kinds(tmp_path) == ["started", "extended", "stopped"]


def test_a_stop_before_any_match_is_not_checkpointed(tmp_path: Path) -> None:
    # the program saved (a log in the run folder) but no checkpoint the arguments name
    err = _stopped(_chunk(tmp_path, ARRAY_RESUME_ARGS=RESUME))
    assert _kinds(tmp_path) == ["started", "extended", "unsaved"], err
    assert "nothing matches out/checkpoint-*" in err
    assert _calls(tmp_path, "scancel") == ["901"]


def test_names_and_patterns_are_never_run_as_code(tmp_path: Path) -> None:
    out = tmp_path / "work" / "out"
    evil = "checkpoint-7 $(touch PWNEDa);`touch PWNEDb`"
    _state(out / "checkpoint-3", 3)
    _state(out / evil, 7)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / contract.SAVED_MARKER).write_text("1 400 0\n")
    err = _stopped(_chunk(tmp_path, "2", ARRAY_RESUME_ARGS=(
        "--resume_from_checkpoint\n{newest:out/checkpoint-*}\n"
        "--x={newest:$(touch PWNED3)*}-{newest:out/checkpoint-3}")))
    # (the second placeholder matches nothing: every resume argument is left out)
    assert _args(tmp_path) == [], err
    assert "nothing matches $(touch PWNED3)*" in err
    err = _stopped(_chunk(tmp_path, "3", ARRAY_RESUME_ARGS=(
        "--resume_from_checkpoint\n{newest:out/checkpoint-*}\n"
        "--x={newest:out/checkpoint-3}/{newest:out/checkpoint-3*}")))
    assert _args(tmp_path) == ["--resume_from_checkpoint", f"out/{evil}",
                               "--x=out/checkpoint-3/out/checkpoint-3"], err
    assert not [p for p in tmp_path.rglob("PWNED*")]


def test_a_program_that_starts_over_in_every_chunk_is_named(tmp_path: Path) -> None:
    # no --resume-args: the Trainer starts at step 0 and saves checkpoint-10 again
    _state(tmp_path / "work" / "out" / "checkpoint-10", 10)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / contract.SAVED_MARKER).write_text("1 400 0\n")
    err = _stopped(_chunk(tmp_path, "2", {"STEP_SAVES": "10"},
                          ARRAY_SAVE_PATHS=str(tmp_path / "work" / "out")))
    assert _args(tmp_path) == []
    assert _kinds(tmp_path) == ["started", "extended", "no_progress"], err
    assert _events(tmp_path)[-1][3] == "10 30"
    assert "made no progress in this chunk" in err and "started over from zero" in err
    assert "--resume_from_checkpoint {newest:out/checkpoint-*}" in err
    assert "checkpointed" not in err
    assert _calls(tmp_path, "scancel") == ["901"]


def test_a_stop_of_a_program_whose_progress_is_unknown_is_not_called_checkpointed(
        tmp_path: Path) -> None:
    err = _stopped(_chunk(tmp_path, ARRAY_SAVE_PATHS=str(tmp_path / "work" / "out"),
                          step_env={"STEP_SAVES": "0"}))
    # (checkpoint-0 holds global_step 0: progress the tool can read, and none was made)
    assert _kinds(tmp_path)[-1] == "no_progress", err
    for name in (contract.CHAIN_EVENTS, contract.CHAIN_IDS):
        (tmp_path / "run" / name).unlink()
    (tmp_path / "work" / "out" / "checkpoint-0" / "trainer_state.json").write_text("{}")
    err = _stopped(_chunk(tmp_path, ARRAY_SAVE_PATHS=str(tmp_path / "work" / "out")))
    assert _kinds(tmp_path) == ["started", "extended", "stopped"], err
    assert "progress not known" in err and "checkpointed stop" not in err
    assert "goes on from the save only if the program resumes by itself" in err


OVERRUN = {"WALLTIME_SECONDS": "12", "STOP_MARGIN": "3000", "KILL_GRACE": "1",
           "OVERRUN_RESERVE": "10", "MAX_CHUNKS": "5"}


def _overrun(tmp_path: Path, chunk: str = "2") -> tuple[int | None, str]:
    """A chunk whose program carries on after the stop signal, until the tool ends it."""
    proc = _chunk(tmp_path, chunk, {"STEP_IGNORES_USR1": "1"}, ARRAY_RESUME_ARGS=RESUME,
                  **OVERRUN)
    err = _stopped(proc)
    return proc.returncode, err


def _earlier_save(tmp_path: Path, overruns: int = 0) -> None:
    _state(tmp_path / "work" / "out" / "checkpoint-10", 10)
    run = tmp_path / "run"
    run.mkdir()
    (run / contract.SAVED_MARKER).write_text("1 400 1700000000\n")
    (run / contract.CHAIN_IDS).write_text("1 400\n2 500\n")
    (run / contract.CHAIN_EVENTS).write_text("".join(
        f"1700000000 1 400 {contract.EV_OVERRAN} {i + 1} 10 30\n" for i in range(overruns))
        + f"1700000000 1 300 {contract.EV_OVERRAN} 1 0 0\n")  # (another chain's)


def test_a_step_past_the_stop_signal_is_ended_and_the_chain_goes_on_from_the_save(
        tmp_path: Path) -> None:
    _earlier_save(tmp_path, overruns=1)
    rc, err = _overrun(tmp_path)
    assert rc == 0, err
    assert "has not stopped after the stop signal, and the walltime is near" in err
    assert "goes on from the last save (2 of at most 2 times in this chain)" in err
    assert _kinds(tmp_path)[-4:] == ["started", "extended", "overran", "stopped"], err
    assert _events(tmp_path)[-2][3] == "2 10 30"
    assert _args(tmp_path) == ["--resume_from_checkpoint", "out/checkpoint-10"]
    assert _calls(tmp_path, "scancel")[0] == "--signal=TERM 500"
    assert "901" not in _calls(tmp_path, "scancel")  # the successor goes on


def test_a_step_past_the_stop_signal_fails_beyond_the_bound_or_without_a_save(
        tmp_path: Path) -> None:
    _earlier_save(tmp_path, overruns=2)
    rc, err = _overrun(tmp_path)
    assert rc == 143, err
    assert "it did 2 times already in this chain, the bound of overruns" in err
    assert _kinds(tmp_path)[-1] == "timeout"
    assert _events(tmp_path)[-1][3].endswith(f" {contract.OVERRUN_BOUND_WORD}")
    assert _calls(tmp_path, "scancel")[-1] == "901"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    rc, err = _overrun(fresh, chunk="1")
    assert rc == 143, err
    assert "with no save to go on from" in err
    assert _kinds(fresh) == ["started", "extended", "timeout"]
    assert _events(fresh)[-1][3].isdigit()  # (a walltime failure, not the bound)
