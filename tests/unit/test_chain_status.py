"""The chain's record read back: ids, events, progress rate, the outcome in words, and the
status text. Slurm's answers are injected (job_states); everything else is the files a
chain leaves in its run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from train import common
from train.batch import contract, saves
from train.client.slurm import chain as slurm_chain
from train.client.slurm import chainstatus, queue, submission
from train.common.errors import UsageError


def _chain(tmp_path: Path, ids: str, events: str, states: dict[str, str],
           monkeypatch: pytest.MonkeyPatch, progress: str | None = None,
           **record: Any) -> dict[str, Any]:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / contract.CHAIN_RECORD).write_text(json.dumps(
        {"name": "e1", "cluster": "local", "max_chunks": 5, "signal_margin": 300,
         "time_budget_seconds": 100, **record}))
    (run / contract.CHAIN_IDS).write_text(ids)
    (run / contract.CHAIN_EVENTS).write_text(events)
    if progress is not None:
        (run / contract.PROGRESS_FILE).write_text(progress)
    monkeypatch.setattr(queue, "job_states", lambda ids: {
        i: {"state": states.get(i, "UNKNOWN")} for i in ids})
    return chainstatus.chain_status(slurm_chain.load_chain(run))


def test_ids_keep_the_first_id_per_chunk_and_skip_junk() -> None:
    assert saves.parse_ids("1 10\njunk\n2 11\n2 99\n3 x\n\n") == [(1, "10"), (2, "11")]


def test_rate_counts_work_per_second_of_each_finished_run() -> None:
    events = slurm_chain.parse_events("100 1 10 started 0 0 0\n"
                                    "150 1 10 stopped 50 200\n"
                                    "160 2 11 started 0 50 200\n"
                                    "210 2 11 stopped 150 200\n"
                                    "220 3 12 started 0 150 200\n")
    assert chainstatus.progress_rate(events) == pytest.approx(150 / 100)
    assert chainstatus.progress_rate(events[:1]) is None


def test_a_running_chain_shows_progress_and_an_estimate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = _chain(tmp_path, "1 10\n2 11\n3 12\n",
                "100 1 10 started 0 0 0\n150 1 10 extended 11\n150 1 10 stopped 50 200\n"
                "160 2 11 started 0 50 200\n210 2 11 stopped 150 200\n"
                "220 3 12 started 0 150 200\n",
                {"10": "COMPLETED", "11": "COMPLETED", "12": "RUNNING"}, monkeypatch,
                progress="150 200\n")
    assert st["state"] == "running" and st["chunks_used"] == 3
    assert (st["done"], st["total"]) == (150, 200)
    assert st["eta_seconds"] == 33 and st["chunks_left_estimate"] == 1
    text = "\n".join(chainstatus.format_status(st))
    assert "progress: 150/200 (75%), 3 of at most 5 chunk(s) used" in text
    assert "(~1 more chunk(s))" in text


@pytest.mark.parametrize(("events", "states", "state", "words"), [
    ("1 1 10 started 0 0 0\n2 1 10 failed 137\n", {"10": "FAILED", "11": "CANCELLED"},
     "failed", "exited with code 137"),
    # the first failing task's own code and its node, as the batch shell recorded them
    ("1 1 10 started 0 0 0\n2 1 10 failed 1 node-b\n", {"10": "FAILED", "11": "CANCELLED"},
     "failed", "exited with code 1 on node node-b; see"),
    ("1 1 10 started 0 0 0\n2 1 10 timeout 61\n", {"10": "TIMEOUT", "11": "CANCELLED"},
     "failed", "raise --signal-margin"),
    # an overrun past the bound: said as the bound, not as a plain walltime failure
    ("1 1 10 started 0 0 0\n2 1 10 timeout 61 bound\n", {"10": "COMPLETED", "11": "CANCELLED"},
     "failed", "after 2 such overruns already (the bound), so it stopped"),
    ("1 1 10 started 0 0 0\n2 1 10 terminated 12\n", {"10": "CANCELLED", "11": "CANCELLED"},
     "cancelled", "cancelled (scancel) after 12 s"),
    ("1 1 10 started 0 0 0\n", {"10": "NODE_FAIL", "11": "CANCELLED"},
     "failed", "NODE_FAIL: node failure"),
    ("1 1 10 started 0 0 0\n", {"10": "OUT_OF_MEMORY", "11": "CANCELLED"},
     "failed", "out of host memory"),
    ("1 1 10 started 0 0 0\n2 1 10 no_progress 40 100\n",
     {"10": "COMPLETED", "11": "CANCELLED"}, "stalled", "done/total now 40/100"),
    ("1 1 10 started 0 0 0\n2 1 10 incomplete 90 100\n", {"10": "COMPLETED"},
     "incomplete", "larger --max-chunks"),
    ("1 1 10 started 0 0 0\n2 1 10 complete 100 100\n",
     {"10": "COMPLETED", "11": "CANCELLED"}, "complete", "the work is done"),
    ("1 1 10 started 0 0 0\n2 0 10 cancelled by-user\n3 1 10 terminated 5\n",
     {"10": "CANCELLED", "11": "CANCELLED"}, "cancelled", "train cancel"),
    # a requeued job: terminated, then started again, and now waiting to run
    ("1 1 10 started 0 0 0\n2 1 10 terminated 9\n3 1 10 started 1 20 100\n",
     {"10": "RUNNING", "11": "PENDING"}, "running", "chunk 1 of at most 5 is running"),
    ("1 1 10 started 0 0 0\n2 1 10 terminated 9\n", {"10": "PENDING", "11": "PENDING"},
     "pending", "waiting"),
])
def test_the_outcome_names_what_happened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         events: str, states: dict[str, str], state: str,
                                         words: str) -> None:
    st = _chain(tmp_path, "1 10\n2 11\n", events, states, monkeypatch)
    assert st["state"] == state, st
    assert words in st["cause"], st["cause"]


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", '{"chunks": []}'])
def test_a_broken_record_is_a_clear_error(tmp_path: Path, text: str) -> None:
    (tmp_path / contract.CHAIN_RECORD).write_text(text)
    with pytest.raises(UsageError, match="chain"):
        slurm_chain.load_chain(tmp_path)


def test_junk_in_the_events_and_ids_is_skipped(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    st = _chain(tmp_path, "1 10\n\x00junk\n", "garbage line\n1 1 10 started 0 0 0\n\xff\n",
                {"10": "RUNNING"}, monkeypatch)
    assert st["state"] == "running"
    assert [c["job_id"] for c in st["chunks"]] == ["10"]


@pytest.mark.parametrize(("events", "states", "reasons", "state", "words"), [
    # the waiting chunk was cancelled by someone else before it ran
    ("1 1 10 started 0 0 0\n2 1 10 extended 11\n3 1 10 stopped 40 100\n",
     {"10": "COMPLETED", "11": "CANCELLED"}, {}, "ended",
     "chunk 2 (job 11) ended CANCELLED before it ran, so the chain stopped at 40/100"),
    # `train submit` killed between the held submission and the release
    ("", {"10": "PENDING"}, {"10": "JobHeldUser"}, "held", "train cancel e1"),
])
def test_a_cut_or_held_chain_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     events: str, states: dict[str, str],
                                     reasons: dict[str, str], state: str,
                                     words: str) -> None:
    st = _chain(tmp_path, "1 10\n2 11\n" if "11" in states else "1 10\n", events, states,
                monkeypatch)
    monkeypatch.setattr(queue, "job_states", lambda ids: {
        i: {"state": states.get(i, "UNKNOWN"), "reason": reasons.get(i)} for i in ids})
    st = chainstatus.chain_status(slurm_chain.load_chain(tmp_path / "run"))
    assert st["state"] == state, st
    assert words in st["cause"], st["cause"]


def test_requeue_mode_counts_runs_against_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = _chain(tmp_path, "1 10\n", "1 1 10 started 0 0 0\n20 1 10 requeued 30 1000\n"
                "30 1 10 started 1 30 1000\n", {"10": "RUNNING"}, monkeypatch,
                progress="30 1000\n", requeue=True, max_chunks=3)
    assert st["chunks_used"] == 2 and st["unit"] == "run"
    assert "run 2 of at most 3 (requeue mode) is running" in st["cause"]
    # 970 units left at 1.5/s = 647 s, in 100 s runs: 7 more, only 2 left under the bound
    assert st["chunks_left_estimate"] == 7
    assert "it will end incomplete" in st["warning"]
    assert "note: at this rate" in "\n".join(chainstatus.format_status(st))


def test_an_incomplete_chain_says_what_bound_would_finish_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = _chain(tmp_path, "1 10\n", "0 1 10 started 0 0 0\n100 1 10 incomplete 50 200\n",
                {"10": "COMPLETED"}, monkeypatch, progress="50 200\n")
    assert st["state"] == "incomplete"
    # 150 left at 0.5/s = 300 s, in 100 s chunks
    assert st["warning"] == "to finish, submit the same job again with --max-chunks 3 or more"


def test_cancelling_an_ended_chain_keeps_how_it_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _chain(tmp_path, "1 10\n", "1 1 10 started 0 0 0\n2 1 10 failed 137\n",
           {"10": "FAILED"}, monkeypatch)
    calls: list[list[str]] = []
    monkeypatch.setattr(common._proc, "run", lambda argv, **kw: calls.append(argv))
    chain = slurm_chain.load_chain(tmp_path / "run")
    assert slurm_chain.cancel_chain(chain) == []
    assert calls == []
    st = chainstatus.chain_status(chain)
    assert st["state"] == "failed" and "137" in st["cause"]


def test_one_unreadable_chain_does_not_hide_the_others(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    for name, text in (("a", '{"name": "a", "cluster": "local"}'), ("b", "{")):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / contract.CHAIN_RECORD).write_text(text)
    proc = run_cli(["status"], cwd=tmp_path)  # (a: no chain.ids yet, so no job to ask of)
    assert proc.returncode == 0, proc.stderr
    assert "a (local): ended" in proc.stdout
    assert "  progress: not known (no progress file, and no save names its step), 0 " \
           "chunk(s) used\n" in proc.stdout  # (a record without its bound)
    assert "b: unreadable" in proc.stdout and "not valid JSON" in proc.stdout
    proc = run_cli(["status", "12345"], cwd=tmp_path)
    assert proc.returncode == 2 and "give that directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def _job(tmp_path: Path) -> Any:
    from train.client.clusters.profiles import Registry
    from train.client.slurm.jobspec import JobSpec
    from train.client.slurm.resolve import resolve

    spec = JobSpec(cluster="local", name="e1", out=str(tmp_path / "runs" / "e1"),
                   runtime="none", workload=("demo",))
    return resolve(spec, Registry(environ={}).get("local"))


def _fake_slurm(monkeypatch: pytest.MonkeyPatch, fail: str | None) -> list[list[str]]:
    import subprocess

    calls: list[list[str]] = []

    def run(argv: list[str], **kw: Any) -> Any:
        calls.append(list(argv))
        if argv[0] == fail:
            raise common._proc.ProcError(argv, 1, f"{argv[0]}: error: refused")
        out = "4242\n" if argv[0] == "sbatch" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(common._proc, "run", run)
    monkeypatch.setattr(queue, "job_states", lambda ids: {
        i: {"state": "COMPLETED"} for i in ids})
    return calls


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("fail", ["sbatch", "scontrol"])
def test_a_failed_resubmission_leaves_the_earlier_chain_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
    run = tmp_path / "runs" / "e1"
    (run / "jobs").mkdir(parents=True)
    (run / contract.CHAIN_RECORD).write_text('{"name": "e1", "cluster": "local"}')
    (run / contract.CHAIN_IDS).write_text("1 100\n2 101\n")
    (run / "jobs" / contract.JOB_SCRIPT).write_text("#!/bin/bash\n# the earlier one\n")
    before = _snapshot(run)
    calls = _fake_slurm(monkeypatch, fail)
    with pytest.raises(common._proc.ProcError):
        submission.submit_chain(_job(tmp_path))
    assert _snapshot(run) == before
    assert (["scancel", "4242"] in calls) == (fail == "scontrol")


def test_a_failed_first_submission_leaves_no_run_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_slurm(monkeypatch, "sbatch")
    with pytest.raises(common._proc.ProcError):
        submission.submit_chain(_job(tmp_path))
    assert not (tmp_path / "runs" / "e1").exists()


def test_a_resubmission_keeps_the_earlier_record_under_its_first_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "runs" / "e1"
    (run / "jobs").mkdir(parents=True)
    (run / contract.CHAIN_RECORD).write_text('{"name": "e1", "cluster": "local"}')
    (run / contract.CHAIN_IDS).write_text("1 100\n")
    (run / "jobs" / contract.JOB_SCRIPT).write_text("old script\n")
    calls = _fake_slurm(monkeypatch, None)
    chain = submission.submit_chain(_job(tmp_path))
    assert chain.ids == ["4242"]
    assert (run / "chain-100.json").read_text() == '{"name": "e1", "cluster": "local"}'
    assert (run / "chain-100.ids").read_text() == "1 100\n"
    assert (run / "jobs" / "chain-100.sbatch").read_text() == "old script\n"
    assert (run / contract.CHAIN_IDS).read_text() == "1 4242\n"
    assert 'chunk "$0" "$@" --' in (run / "jobs" / contract.JOB_SCRIPT).read_text()
    # the engine's copy, and the job record it reads
    assert (run / ".train" / "train" / "batch" / "chunk.py").is_file()
    assert json.loads((run / contract.CHAIN_RECORD).read_text())["job"]["run_dir"] == str(run)
    assert not list((run / "jobs").glob(".*"))
    assert calls[0][:3] == ["sbatch", "--parsable", "--hold"]
    assert calls[-1] == ["scontrol", "release", "4242"]


@pytest.mark.parametrize("text", ["[]", "{}", '{"jobs": {}}', '{"jobs": [1]}',
                                  '{"jobs": [{"state": "X"}]}', "not json", "null"])
def test_unexpected_squeue_json_is_a_value_error_naming_squeue(text: str) -> None:
    from train.client.slurm.queue import parse_squeue_json

    with pytest.raises(ValueError):
        parse_squeue_json(text)


def test_squeue_json_with_structured_job_ids() -> None:
    from train.client.slurm.queue import parse_squeue_json

    text = '{"jobs": [{"job_id": {"set": true, "number": 42}, "job_state": ["RUNNING"]}]}'
    assert parse_squeue_json(text)["42"]["state"] == "RUNNING"


# -- a program's own progress (--entry command): started over, unknown, overran -------

def test_a_command_that_made_no_progress_is_named_with_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = "1 1 10 started 0 0 0\n2 1 10 stopped 10 30\n3 2 11 started 0 10 30\n" \
             "4 2 11 no_progress 10 30\n"
    st = _chain(tmp_path, "1 10\n2 11\n", events, {"10": "COMPLETED", "11": "COMPLETED"},
                monkeypatch, entry="command")
    assert st["state"] == "stalled"
    assert "chunk 2 (job 11) made no progress" in st["cause"]
    assert "started over from zero" in st["cause"]
    assert "--resume_from_checkpoint {newest:out/checkpoint-*}" in st["cause"]
    # no progress file: the events' progress (what the saves showed) is the chain's
    assert (st["done"], st["total"]) == (10, 30)
    st = _chain(tmp_path, "1 10\n2 11\n", events, {"10": "COMPLETED", "11": "COMPLETED"},
                monkeypatch, entry="command", resume_args="--resume x")
    assert "it was given --resume-args '--resume x'" in st["cause"]


@pytest.mark.parametrize(("detail", "words"), [
    ("0 0", "reached before the work was done (its progress is not known"),
    ("40 0", "reached at step 40"), ("40 100", "reached at 40/100")])
def test_an_unknown_progress_is_never_given_as_0_of_0(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, detail: str, words: str) -> None:
    st = _chain(tmp_path, "1 10\n", f"1 1 10 started 0 0 0\n2 1 10 incomplete {detail}\n",
                {"10": "COMPLETED"}, monkeypatch, entry="command")
    assert st["state"] == "incomplete"
    assert words in st["cause"] and "0/0" not in st["cause"]
    cut = _chain(tmp_path, "1 10\n2 11\n", f"1 1 10 started 0 0 0\n2 1 10 stopped {detail}\n",
                 {"10": "COMPLETED", "11": "CANCELLED"}, monkeypatch, entry="command")
    assert cut["state"] == "ended" and "0/0" not in cut["cause"]
    assert "stopped; submit" in cut["cause"] if detail == "0 0" else "stopped at" in cut["cause"]


def test_a_chunk_that_overran_is_said_in_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = ("1 1 10 started 0 0 0\n2 1 10 extended 11\n3 1 10 overran 1 20 0\n"
              "4 1 10 stopped 20 0\n5 2 11 started 0 20 0\n")
    st = _chain(tmp_path, "1 10\n2 11\n", events, {"10": "COMPLETED", "11": "RUNNING"},
                monkeypatch, entry="command")
    assert st["state"] == "running"
    lines = "\n".join(chainstatus.format_status(st))
    assert ("note: chunk 1 ran into its walltime after the stop signal; the tool ended it "
            "and the chain went on from the save before (1 of at most 2 times") in lines
    assert "progress: step 20" in lines


# -- what status says of each chunk, of an unknown progress, of earlier chains ---------

def test_an_unknown_progress_is_said_not_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = _chain(tmp_path, "1 10\n", "1 1 10 started 0 0 0\n", {"10": "RUNNING"},
                monkeypatch, entry="command")
    assert st["done"] is None and st["total"] is None
    lines = chainstatus.format_status(st)
    assert ("  progress: not known (no progress file, and no save names its step), 1 of at "
            "most 5 chunk(s) used") in lines


def test_each_chunks_end_is_said_in_words_and_json_keeps_the_event_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = ("1 1 10 started 0 0 0\n2 1 10 extended 11\n3 1 10 stopped 40 100\n"
              "4 2 11 started 0 40 100\n5 2 11 extended 12\n6 2 11 stopped 80 100\n"
              "7 3 12 started 0 80 100\n8 3 12 failed 1 node-b\n")
    st = _chain(tmp_path, "1 10\n2 11\n3 12\n", events,
                {"10": "COMPLETED", "11": "COMPLETED", "12": "FAILED"}, monkeypatch,
                entry="command")
    assert [c["events"] for c in st["chunks"]] == [
        ["started", "extended", "stopped"], ["started", "extended", "stopped"],
        ["started", "failed"]]
    json.dumps(st)  # what --json prints
    lines = chainstatus.format_status(st)
    assert ("  chunk 1: job 10 COMPLETED: stopped after a save (at 40/100); chunk 2 goes on "
            "from it") in lines
    assert "  chunk 3: job 12 FAILED: failed: exit code 1 on node node-b" in lines
    assert not any("extended" in line or "events:" in line for line in lines)


_EXITED = "exited 0 before any stop signal, and nothing reported progress"


@pytest.mark.parametrize(("detail", "entry", "said", "ended"), [
    # a command that exits 0 at once: the tool takes it as done, nothing more is known
    ("0 0", "command", _EXITED, _EXITED),
    ("30 30", "command", "the work is done (at 30/30)", "finished the work (at 30/30)"),
    ("0 0", "train", "the work is done", "finished the work")])
def test_an_exit_0_with_no_progress_is_not_called_the_work_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, detail: str, entry: str, said: str,
        ended: str) -> None:
    st = _chain(tmp_path, "1 10\n", f"1 1 10 started 0 0 0\n2 1 10 complete {detail}\n",
                {"10": "COMPLETED"}, monkeypatch, entry=entry)
    assert st["state"] == "complete"
    assert said in st["cause"] and st["chunks"][0]["ended"].startswith(ended)
    assert ("the work is done" in st["cause"]) == (said != _EXITED)


def test_a_resubmitted_chain_shows_the_earlier_chains_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "runs" / "e1"
    (run / "jobs").mkdir(parents=True)
    (run / contract.CHAIN_RECORD).write_text('{"name": "e1", "cluster": "local"}')
    (run / contract.CHAIN_IDS).write_text("1 100\n2 101\n")
    (run / contract.CHAIN_EVENTS).write_text(
        "1 1 100 started 0 0 0\n2 1 100 extended 101\n3 1 100 stopped 40 100\n"
        "4 2 101 started 0 40 100\n5 2 101 incomplete 70 100\n")
    _fake_slurm(monkeypatch, None)  # the resubmission: `train submit` of the same run
    submission.submit_chain(_job(tmp_path))
    with open(run / contract.CHAIN_EVENTS, "a") as fh:
        fh.write("6 1 4242 started 0 70 100\n")
    asked: list[list[str]] = []
    monkeypatch.setattr(queue, "job_states", lambda ids: asked.append(list(ids)) or {
        "4242": {"state": "RUNNING"}, "100": {"state": "COMPLETED"},
        "101": {"state": "COMPLETED"}})
    st = chainstatus.chain_status(slurm_chain.load_chain(run))
    assert asked == [["4242", "100", "101"]]
    assert st["state"] == "running" and [c["job_id"] for c in st["chunks"]] == ["4242"]
    (earlier,) = st["earlier_chains"]
    assert earlier["first_job"] == "100"
    assert [c["events"] for c in earlier["chunks"]] == [
        ["started", "extended", "stopped"], ["started", "incomplete"]]
    lines = chainstatus.format_status(st)
    at = lines.index("  earlier chain of this run folder (first job 100):")
    assert lines[at + 1].startswith("    chunk 1: job 100 COMPLETED: stopped after a save")
    assert lines[at + 2].startswith("    chunk 2: job 101 COMPLETED: stopped after a save "
                                    "(at 70/100), the last chunk")


# -- chunks that start over from the same save --------------------------------------------

def test_kill_mode_chunks_of_unknown_progress_are_not_told_a_larger_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The field's case: a program whose saves are further apart than a chunk, stopped by
    the tool (--stop-mode kill): every chunk went on from the same save, its progress not
    known; "submit again with a larger --max-chunks" would repeat it for ever."""
    events = ("1 1 10 started 0 0 0\n2 1 10 extended 11\n3 1 10 stopped 0 0\n"
              "4 2 11 started 0 0 0\n5 2 11 extended 12\n6 2 11 stopped 0 0\n"
              "7 3 12 started 0 0 0\n8 3 12 incomplete 0 0\n")
    states = {"10": "COMPLETED", "11": "COMPLETED", "12": "COMPLETED"}
    st = _chain(tmp_path, "1 10\n2 11\n3 12\n", events, states, monkeypatch,
                entry="command", stop_mode="kill", max_chunks=3)
    assert st["state"] == "incomplete"
    assert "save more often than once a chunk, or give a longer --time" in st["cause"]
    assert "continue from the last save" not in st["cause"]
    assert st["redone"]["known"] is False and st["redone"]["chunk"] == 3
    # in signal mode the program saves at the stop: the bound is what ended it
    st = _chain(tmp_path, "1 10\n2 11\n3 12\n", events, states, monkeypatch,
                entry="command", stop_mode="signal", max_chunks=3)
    assert "larger --max-chunks to continue from the last save" in st["cause"]
    assert st["redone"] is None


def test_a_chunk_that_went_on_from_a_save_and_added_nothing_names_the_save_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = ("1 1 10 started 0 0 0\n2 1 10 stopped 500 0\n"
              "3 2 11 started 0 500 0\n4 2 11 no_progress 500 0\n")
    st = _chain(tmp_path, "1 10\n2 11\n", events, {"10": "COMPLETED", "11": "COMPLETED"},
                monkeypatch, entry="command", stop_mode="kill")
    assert st["state"] == "stalled"
    assert "chunk 2 went on from where chunk 1 stopped (at step 500)" in st["cause"]
    assert "save more often than once a chunk, or give a longer --time" in st["cause"]
    assert st["redone"]["known"] is True


def test_a_chunk_that_began_no_further_than_the_one_before_is_noted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = ("1 1 10 started 0 100 1000\n2 1 10 stopped 180 1000\n"
              "3 2 11 started 0 100 1000\n4 2 11 stopped 180 1000\n"
              "5 3 12 started 0 100 1000\n")
    st = _chain(tmp_path, "1 10\n2 11\n3 12\n", events,
                {"10": "COMPLETED", "11": "COMPLETED", "12": "RUNNING"}, monkeypatch,
                entry="command", stop_mode="kill", progress="100 1000\n")
    assert st["state"] == "running"
    lines = "\n".join(chainstatus.format_status(st))
    assert ("note: chunk 2 began at 100/1000, no further than chunk 1 began: the save it "
            "went on from holds none of chunk 1's work") in lines


def test_the_chain_record_keeps_the_stop_mode(tmp_path: Path) -> None:
    from train.client.clusters.profiles import Registry
    from train.client.slurm.jobspec import JobSpec
    from train.client.slurm.resolve import resolve

    spec = JobSpec(cluster="local", name="e1", out=str(tmp_path / "runs" / "e1"),
                   runtime="none", entry="command", stop_mode="kill", max_chunks=3,
                   workload=("python3", "fit.py"))
    job = resolve(spec, Registry(environ={}).get("local"))
    assert submission.chain_record(job, "10", 1, tmp_path / "s")["stop_mode"] == "kill"


def test_a_chain_with_a_floor_counts_its_bound_in_time_not_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks that started short (--time-min) add to the count: chunk 4 of a bound of 3
    is no contradiction, and status does not say one."""
    timed = {"max_chunks": 3, "job": {"time_min_seconds": 900, "walltime_seconds": 3600}}
    events = ("100 1 10 started 0 0 0\n100 1 10 limit 1200 3600\n150 1 10 stopped 50 200\n"
              "160 2 11 started 0 50 200\n160 2 11 limit 1200 3600\n210 2 11 stopped 80 200\n"
              "220 3 12 started 0 80 200\n220 3 12 limit 1200 3600\n270 3 12 stopped 110 200\n"
              "280 4 13 started 0 110 200\n280 4 13 limit 3600 3600\n")
    st = _chain(tmp_path, "1 10\n2 11\n3 12\n4 13\n", events,
                {"10": "COMPLETED", "11": "COMPLETED", "12": "COMPLETED", "13": "RUNNING"},
                monkeypatch, progress="110 200\n", **timed)
    text = "\n".join(chainstatus.format_status(st))
    assert st["cause"] == "chunk 4 is running", st["cause"]
    assert "4 chunk(s) used (the bound: 3 x --time of chunk time limits)" in text, text
    ended = _chain(tmp_path, "1 10\n", "100 1 10 started 0 0 0\n150 1 10 incomplete 50 200\n",
                   {"10": "COMPLETED"}, monkeypatch, **timed)
    assert "the bound of 3 x --time of chunk time was reached at 50/200" in ended["cause"], \
        ended["cause"]


def test_a_chain_with_a_floor_is_not_told_it_ends_incomplete_while_its_time_lasts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three chunks started short (20 min of 1 h) and the fourth runs: of a bound of 3 x 1 h
    of chunk time limits, 1 h is left after it, room for the one more chunk the rate
    needs. Counted in chunks (4 of 3) it read as none left."""
    timed = {"max_chunks": 3, "walltime_seconds": 3600, "time_budget_seconds": 3300,
             "job": {"time_min_seconds": 900, "walltime_seconds": 3600}}
    events = "".join(f"{100 + 1000 * k} {k + 1} {10 + k} started 0 {done} 200\n"
                     f"{100 + 1000 * k} {k + 1} {10 + k} limit {limit} 3600\n"
                     + (f"{1000 + 1000 * k} {k + 1} {10 + k} stopped {done + 30} 200\n"
                        if k < 3 else "")
                     for k, (done, limit) in enumerate(((20, 1200), (50, 1200), (80, 1200),
                                                        (110, 3600))))
    states = {"10": "COMPLETED", "11": "COMPLETED", "12": "COMPLETED", "13": "RUNNING"}
    st = _chain(tmp_path, "1 10\n2 11\n3 12\n4 13\n", events, states, monkeypatch,
                progress="110 200\n", **timed)
    assert st["chunks_left_estimate"] == 1 and st["warning"] is None, st["warning"]
    # the same with the fourth chunk started short too: 1 h 20 min left, room still
    st = _chain(tmp_path, "1 10\n2 11\n3 12\n4 13\n", events.replace(
        "limit 3600", "limit 1200"), states, monkeypatch, progress="110 200\n", **timed)
    assert st["warning"] is None, st["warning"]
    # chunks at their whole --time: the third, running, is the bound's last, and the work
    # needs more: status says so
    whole = events.replace("limit 1200", "limit 3600").split("3 12 stopped")[0]
    st = _chain(tmp_path, "1 10\n2 11\n3 12\n", whole.rsplit("\n", 1)[0] + "\n",
                {**states, "12": "RUNNING"}, monkeypatch, progress="80 200\n", **timed)
    assert "more than the 1 left under --max-chunks 3" in (st["warning"] or ""), st


def test_a_pending_sweep_task_is_found_by_the_id_status_shows_for_it(tmp_path: Path) -> None:
    # `train status --tasks` lists a task that has not started as job ARRAY_TASK: that id
    # names its run for status, cancel, logs and doctor as a plain job id does
    runs = tmp_path / "runs"
    task = runs / "sw" / "seed-1"
    task.mkdir(parents=True)
    (runs / "sw" / contract.SWEEP_RECORD).write_text("{}")
    (task / contract.CHAIN_RECORD).write_text("{}")
    (task / contract.CHAIN_IDS).write_text("1 15845_1\n")
    assert slurm_chain.find_run("15845_1", runs) == task
    with pytest.raises(UsageError, match="no run named or holding job"):
        slurm_chain.find_run("15845_2", runs)


def test_a_failed_cancel_of_one_chain_says_its_error_once(tmp_path: Path) -> None:
    import os

    from tests.conftest import run_cli

    sbin = tmp_path / "sbin"
    sbin.mkdir()
    for name in ("squeue", "sacct"):  # Slurm not answering: cancel cannot know the states
        (sbin / name).write_text(f"#!/bin/sh\necho '{name}: error: connection refused' >&2\n"
                                 "exit 1\n")
        (sbin / name).chmod(0o755)
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / contract.CHAIN_RECORD).write_text('{"name": "r", "cluster": "local"}')
    (run / contract.CHAIN_IDS).write_text("1 101\n")
    proc = run_cli(["cancel", "r"], cwd=tmp_path, timeout=60,
                   env={"PATH": f"{sbin}:{os.environ['PATH']}"})
    assert proc.returncode == 3 and proc.stderr.count("cannot reach Slurm") == 1, proc.stderr
    assert proc.stderr.count("squeue: error: connection refused") == 1, proc.stderr


@pytest.mark.parametrize("damage", ["fifo", "junk"])
def test_a_chain_whose_ids_are_damaged_is_said_unreadable_by_cancel_and_status(
        tmp_path: Path, damage: str) -> None:
    """`train cancel` said "no active jobs" (exit 0) of a chain whose chain.ids is a FIFO or
    holds no job id: its jobs are not known, so neither is whether one is active."""
    import os

    from tests.conftest import run_cli

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / contract.CHAIN_RECORD).write_text('{"name": "r", "cluster": "local"}')
    if damage == "fifo":
        os.mkfifo(run / contract.CHAIN_IDS)
    else:
        (run / contract.CHAIN_IDS).write_bytes(b"\xff\xfe\n1 x\n--me\n")
    said = f"runs/r/{contract.CHAIN_IDS}"
    for command in ("cancel", "status", "logs", "doctor"):
        proc = run_cli([command, "r"], cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and proc.stderr.count(said) == 1, (command, proc.stderr)
        assert "Traceback" not in proc.stderr and "no active jobs" not in proc.stdout
    proc = run_cli(["status"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and "r: unreadable  runs/r\n" in proc.stdout and \
        said in proc.stdout, proc.stdout
def test_logs_of_a_chunk_that_ended_without_a_log_do_not_say_it_has_not_started(
        tmp_path: Path) -> None:
    """A chunk Slurm no longer knows (status: ended) whose log was never written (cancelled
    while it waited, a log folder it could not write) was said to have not started."""
    import sys

    from tests.conftest import run_cli
    from tests.unit.test_sweep_defects import _slurm

    env = _slurm(tmp_path, "ended")
    submit = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "lg", "--entry",
                      "command", "--runtime", "none", "--python", sys.executable, "--",
                      "true"], cwd=tmp_path, env=env)
    assert submit.returncode == 0, submit.stderr
    proc = run_cli(["logs", "lg"], cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "has not started, or ended before writing it" in proc.stderr, proc.stderr
    assert "`train status lg`" in proc.stderr, proc.stderr

