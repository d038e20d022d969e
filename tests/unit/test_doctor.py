"""`train doctor`'s rules on captured log texts and Slurm states (real failing jobs on the
test cluster: tests/integration/test_doctor.py). Each case names where its text comes from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from train.batch import contract
from train.client.doctor import logread
from train.client.doctor import report as doctor_report
from train.client.slurm import chainstatus
from train.client.slurm.chain import load_chain
from train.client.slurm.chainstatus import chain_status
from train.common.errors import UsageError

RESOURCES = {"nodes": 1, "processes_per_node": 4, "gpus_per_node": 4, "ntasks_per_node": 4,
             "launch": "tasks", "workers": 8, "worker_mem_mb": 8192, "mem_mb": 262144,
             "batch_size": 256}


def make_run(root: Path, logs: dict[str, str], name: str = "r",
             resources: dict[str, Any] | None = None) -> Path:
    """A run directory as `train submit` leaves it: its record, ids and job logs."""
    run_dir = root / name
    (run_dir / contract.LOG_DIR).mkdir(parents=True)
    record = {"name": name, "cluster": "local", "max_chunks": 3, "signal_margin": 120,
              "resources": RESOURCES if resources is None else resources}
    (run_dir / contract.CHAIN_RECORD).write_text(json.dumps(record))
    ids = sorted({f.split("-")[-1].split(".")[0] for f in logs} or {"101"})
    (run_dir / contract.CHAIN_IDS).write_text(
        "".join(f"{i + 1} {job}\n" for i, job in enumerate(ids)))
    for file_name, text in logs.items():
        (run_dir / contract.LOG_DIR / file_name).write_text(text)
    return run_dir


def status(state: str, exit_code: str | None = None, events: list[str] | None = None,
           reason: str | None = None, chain_state: str = "failed",
           job_id: str = "101") -> dict[str, Any]:
    return {"name": "r", "state": chain_state, "cause": "as Slurm says",
            "chunks": [{"chunk": 1, "job_id": job_id, "state": state, "exit": exit_code,
                        "reason": reason, "events": events or ["started"]}]}


def diagnose(tmp_path: Path, err: str, st: dict[str, Any], out: str = "",
             resources: dict[str, Any] | None = None, events: str = "") -> doctor_report.Report:
    run_dir = make_run(tmp_path, {"r-101.err": err, "r-101.out": out}, resources=resources)
    (run_dir / contract.CHAIN_EVENTS).write_text(events)
    return doctor_report.diagnose(load_chain(run_dir), st)


# (cause, Slurm state, exit code, error log text, words the fix must hold); the comment
# above each says where the text's format comes from
CASES = [
    # slurmstepd, task/cgroup plugin (Slurm 22.05-24.11): the step's oom_kill count
    ("host_oom", "OUT_OF_MEMORY", "0:125",
     "slurmstepd: error: Detected 5 oom_kill events in StepId=101.0. Some of the step "
     "tasks have been OOM Killed.\n", ["--workers 2", "4 processes x 8 DataLoader workers",
                                        "256G // (4 x 24G) = 2"]),
    # torch 2.x caching allocator
    ("gpu_oom", "FAILED", "1:0",
     "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
     "total capacity of 79.10 GiB of which 1.06 GiB is free.\n", ["--batch-size 128"]),
    # ours: workloads/runtime/memory.py PreallocationError (the optimizer's first step, up front)
    ("gpu_oom", "FAILED", "3:0",
     "train: error: out of memory on cuda:0 (NVIDIA H100) while preallocating optimizer "
     "state and a batch of 256 at res 64: ...\n", ["optimizer's first step",
                                                     "--fallback-batch 128"]),
    # torch c10d TCPStore (torch 2.1-2.6): the rank-0 store waits for the others
    ("rendezvous", "FAILED", "1:0",
     "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
     "1/16 clients joined.\n", ["srun"]),
    # torch ProcessGroupNCCL watchdog (torch 2.2+)
    ("collective_timeout", "FAILED", "6:0",
     "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation "
     "timeout: WorkNCCL(SeqNum=1027, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
     "Timeout(ms)=600000) ran for 600070 milliseconds before timing out.\n",
     ["NCCL_DEBUG=INFO"]),
    # slurmstepd's banner when the walltime passes (src/slurmd/slurmstepd/req.c)
    ("walltime", "TIMEOUT", "0:15",
     "slurmstepd: error: *** JOB 101 ON n1 CANCELLED AT 2026-11-22T10:00:00 DUE TO TIME "
     "LIMIT ***\n", ["--signal-margin"]),
    ("preempted", "PREEMPTED", "0:15",
     "slurmstepd: error: *** JOB 101 ON n1 CANCELLED AT 2026-11-22T10:00:00 DUE TO "
     "PREEMPTION ***\n", ["--requeue"]),
    ("node_failure", "NODE_FAIL", "0:0",
     "srun: error: Node failure on n2\nslurmstepd: error: *** JOB 101 ON n1 CANCELLED AT "
     "2026-11-22T10:00:00 DUE TO NODE FAILURE ***\n", ["--exclude"]),
    # torch: masked_fill with -1e9 on a Half tensor (the field notes' FP16 mask)
    ("nonfinite", "FAILED", "1:0",
     "RuntimeError: value cannot be converted to type at::Half without overflow\n",
     ["--precision bf16", "finfo"]),
    # torch's CUDA init on an old driver (torch/cuda/__init__.py)
    ("cuda_driver", "FAILED", "1:0",
     "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). "
     "Please update your GPU driver\n", ["BASE_IMAGE"]),
    # ours: workloads/envs/pysc2_env.py check_available
    ("missing_payload", "FAILED", "3:0",
     "train: error: workload sc2 needs the StarCraft II binary: SC2PATH=/opt/sc2 has no "
     "Versions/Base*/SC2_x64\n", ["sc2 image"]),
    # Lmod 8.x
    ("module_missing", "FAILED", "1:0",
     "Lmod has detected the following error:  The following module(s) are unknown: "
     "\"apptainer/9.9\"\n", ["modules:"]),
    # Apptainer 1.2-1.4 (cmd/internal/cli/actions.go)
    ("image_unopenable", "FAILED", "255:0",
     "FATAL:   could not open image /scratch/u/train.sif: failed to retrieve path for "
     "/scratch/u/train.sif: lstat /scratch/u/train.sif: no such file or directory\n",
     ["--image"]),
    # Apptainer 1.4 (a profile bind the node does not mount)
    ("bind_missing", "FAILED", "255:0",
     "INFO:    Converting SIF file to temporary sandbox...\nWARNING: skipping mount of "
     "/depot: stat /depot: no such file or directory\nFATAL:   container creation failed: "
     "mount hook function failure: mount /depot->/depot error: while mounting /depot: "
     "mount source /depot doesn't exist\n", ["binds:", "--exclude"]),
    # ours: the apptainer task wrapper (Apptainer itself says nothing)
    ("nv_no_driver", "FAILED", "1:0",
     "train: apptainer --nv on n1: no NVIDIA driver on this node (/dev/nvidiactl is "
     "missing): the program sees no GPU\ntrain: error: --device cuda: CUDA is not "
     "available\n", ["--gpus-per-node"]),
    # CPython
    ("import_error", "FAILED", "1:0",
     "Traceback (most recent call last):\nModuleNotFoundError: No module named 'timm'\n",
     ["rebuild the image"]),
    ("disk_full", "FAILED", "1:0",
     "train: error: writing a checkpoint in /home/u/runs/r/seed_4/checkpoints failed: "
     "[Errno 28] No space left on device\n", ["scratch"]),
    ("disk_full", "FAILED", "1:0",
     "OSError: [Errno 122] Disk quota exceeded: '/home/u/runs/r/status.json'\n",
     ["quota"]),
]


@pytest.mark.parametrize(("cause", "state", "exit_code", "err", "fix_words"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rule_names_its_cause_evidence_and_fix(
        tmp_path: Path, cause: str, state: str, exit_code: str, err: str,
        fix_words: list[str]) -> None:
    report = diagnose(tmp_path, "some start-up line\n" + err,
                      status(state, exit_code, ["started", "failed"]))
    assert not report.healthy
    first = report.findings[0]
    assert first.cause == cause, [f.cause for f in report.findings]
    assert (first.chunk, first.job_id) == (1, "101")
    for word in fix_words:
        assert word in first.fix, first.fix
    if state not in ("NODE_FAIL",) or first.evidence:
        ev = first.evidence[0]
        assert ev.file.endswith("r-101.err") and ev.line >= 2
        assert ev.text in err


def test_the_same_rules_without_grep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                     ) -> None:
    """The block search finds the same lines, with the same numbers, as grep -F."""
    text = "".join(f"line {i}\n" for i in range(50_000)) + CASES[0][3] + "tail\n" * 3
    path = tmp_path / "x.err"
    path.write_text(text)
    with_grep = list(logread.candidate_lines(path))
    monkeypatch.setattr(logread.shutil, "which", lambda _name: None)
    without = list(logread.candidate_lines(path))
    small_blocks = list(logread._candidate_lines_python(path, logread._ALL_NEEDLES, 4096))
    assert with_grep == without == small_blocks
    assert [(n, at) for n, _, at in with_grep] == [(50_001, None)]


def test_exit_137_without_a_message_is_a_sigkill_that_points_at_memory(
        tmp_path: Path) -> None:
    report = diagnose(tmp_path, "/var/spool/slurm/job101/slurm_script: line 9: 1234 Killed "
                      "python train.py\n", status("FAILED", "137:0", ["started", "failed"]))
    f = report.findings[0]
    assert f.cause == "sigkill" and "137" in f.detail and "--workers" in f.fix


def test_host_memory_fix_blames_workers_only_when_they_filled_it(tmp_path: Path) -> None:
    # one process, one worker (counted at 24G, the field's figure) in 64G: not the workers
    res = {**RESOURCES, "processes_per_node": 1, "workers": 1, "worker_mem_mb": 2048,
           "mem_mb": 65536}
    report = diagnose(tmp_path, CASES[0][3], status("OUT_OF_MEMORY", "0:125"),
                      resources=res)
    assert report.findings[0].fix.startswith("more --mem"), report.findings[0].fix
    # four of them: 96G by that figure, over the 64G: fewer workers first
    res["processes_per_node"] = 4
    report = diagnose(tmp_path / "b", CASES[0][3], status("OUT_OF_MEMORY", "0:125"),
                      resources=res)
    assert report.findings[0].fix.startswith("--workers 0"), report.findings[0].fix


def test_a_python_memory_error_is_host_memory(tmp_path: Path) -> None:
    report = diagnose(tmp_path, "Traceback (most recent call last):\nMemoryError\n",
                      status("FAILED", "1:0", ["started", "failed"]))
    assert report.findings[0].cause == "host_oom"


def test_scancel_by_someone_else_is_a_finding_train_cancel_is_not(tmp_path: Path) -> None:
    st = status("CANCELLED", "0:15", ["started", "terminated"], chain_state="cancelled")
    report = diagnose(tmp_path, "", st)
    assert [f.cause for f in report.findings] == ["cancelled"]
    run_dir = tmp_path / "r"
    (run_dir / contract.CHAIN_EVENTS).write_text("1795000000 1 101 cancelled\n")
    assert doctor_report.diagnose(load_chain(run_dir), st).healthy


def test_train_cancel_of_an_earlier_chain_is_not_this_chains(tmp_path: Path) -> None:
    """chain.events holds every chain of the run folder: the earlier chain's `train cancel`
    passed this chain's scancel by someone else as asked for."""
    st = status("CANCELLED", "0:15", ["started", "terminated"], chain_state="ended",
                job_id="201")
    run_dir = make_run(tmp_path, {"r-201.err": ""})
    (run_dir / "chain-101.ids").write_text("1 101\n")  # the earlier chain, as kept
    (run_dir / "chain-101.json").write_text((run_dir / contract.CHAIN_RECORD).read_text())
    (run_dir / contract.CHAIN_EVENTS).write_text(
        "1795000000 1 101 started 0 0 40\n1795000050 0 101 cancelled by-user\n"
        "1795001000 1 201 started 0 0 40\n1795001100 1 201 terminated\n")
    chain = load_chain(run_dir)
    assert [e.first_job for e in chain.earlier] == ["101"]
    report = doctor_report.diagnose(chain, st)
    assert [f.cause for f in report.findings] == ["cancelled"], report.verdict


def test_a_lightning_rendezvous_that_never_completes(tmp_path: Path) -> None:
    """--ntasks=8 with 8 GPUs on one task: Lightning announces member 1 of 8 and waits
    (the field notes' hang); the walltime ends it."""
    err = ("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/8\n"
           "slurmstepd: error: *** JOB 101 ON n1 CANCELLED AT 2026-11-22T10:00:00 DUE TO "
           "TIME LIMIT ***\n")
    report = diagnose(tmp_path, err, status("TIMEOUT", "0:15", ["started", "timeout"]))
    causes = [f.cause for f in report.findings]
    assert causes[:2] == ["walltime", "rendezvous"], causes
    rdv = report.findings[1]
    assert "1 of 8" in rdv.detail and "srun" in rdv.fix
    # a healthy start of the same program is no finding
    ok = "".join(f"Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/8\n"
                 for r in range(8))
    report = diagnose(tmp_path / "ok", ok, status("COMPLETED", "0:0",
                                                  ["started", "complete"], None, "complete"))
    assert report.healthy, report.verdict


def test_tasks_that_do_not_match_the_gpus_are_named(tmp_path: Path) -> None:
    res = {**RESOURCES, "ntasks_per_node": 1, "gpus_per_node": 8}
    report = diagnose(tmp_path, "1/8 clients joined.\n", status("FAILED", "1:0"),
                      resources=res)
    assert "--ntasks-per-node 8" in report.findings[0].fix


def test_an_unknown_failure_shows_the_exit_code_and_the_tail(tmp_path: Path) -> None:
    err = "".join(f"noise {i}\n" for i in range(30)) + "it went wrong somewhere\n"
    report = diagnose(tmp_path, err, status("FAILED", "2:0", ["started", "failed"]))
    f = report.findings[0]
    assert f.cause == "unknown" and "2:0" in f.detail
    assert f.evidence[-1].text == "it went wrong somewhere" and f.evidence[-1].line == 31
    assert len(f.evidence) == 6  # the end of the log, all of it shown
    assert all(line in doctor_report.format_report(report) for line in (
        f"  evidence: {f.evidence[-1].file}:31: it went wrong somewhere",))


@pytest.mark.parametrize(("exit_code", "cause"), [("139:0", "native_crash"),
                                                  ("0:11", "native_crash"),
                                                  ("0:9", "sigkill"), ("137:0", "sigkill")])
def test_a_signal_names_the_death(tmp_path: Path, exit_code: str, cause: str) -> None:
    """sacct's CODE:SIGNAL and a shell's 128+N: SIGSEGV is a crash in native code, SIGKILL
    a kill (or the OOM killer)."""
    report = diagnose(tmp_path, "srun: error: n1: task 0: Segmentation fault\n",
                      status("FAILED", exit_code, ["started", "failed"]))
    assert report.findings[0].cause == cause, report.verdict


def test_no_error_log_says_where_to_look(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"r-101.out": ""})
    report = doctor_report.diagnose(load_chain(run_dir), status("FAILED", "1:0"))
    f = report.findings[0]
    assert f.cause == "unknown" and "no error log was written" in f.fix
    assert "sacct -j 101" in f.fix


def test_a_python_error_is_quoted_from_the_end_of_the_log(tmp_path: Path) -> None:
    err = "Traceback (most recent call last):\n  File \"u.py\", line 1\nKeyError: 'lr'\n"
    report = diagnose(tmp_path, err, status("FAILED", "1:0", ["started", "failed"]))
    f = report.findings[0]
    assert f.cause == "python_error" and f.detail == "KeyError: 'lr'"
    assert f.evidence[0].line == 3


@pytest.mark.parametrize("line", [
    # the batch shell's own hint (job-lib.sh) and train launch's under torchrun
    "12:00:01 train-job[1]: the program died of the stop signal USR1: it needs a handler "
    "(checkpoint, exit 0), or submit with --stop-signal none",
    "12:00:01 ERROR train: the stop signal USR1 reached a worker that has no handler for it: "
    "local rank 0 (pid 4242) on n1 died of it (exit 138)",
])
def test_a_program_without_a_stop_handler_is_named_with_both_fixes(tmp_path: Path,
                                                                   line: str) -> None:
    err = "training step failed with exit code 138\n" + line + "\n"
    report = diagnose(tmp_path, err, status("FAILED", "138:0", ["started", "failed"]))
    f = report.findings[0]
    assert f.cause == "stop_signal_unhandled", report.verdict
    assert "handler" in f.fix and "--stop-signal none" in f.fix


def test_a_dependency_that_can_never_be_met(tmp_path: Path) -> None:
    report = diagnose(tmp_path, "", status("PENDING", None, [],
                                           "DependencyNeverSatisfied", "pending"))
    assert report.findings[0].cause == "dependency_never"
    assert "train cancel" in report.findings[0].fix


def test_a_healthy_run_is_exit_0_and_its_chunks_are_told(tmp_path: Path) -> None:
    report = diagnose(tmp_path, "", status("COMPLETED", "0:0", ["started", "complete"],
                                           chain_state="complete"),
                      events="1 1 101 started 0 0 0\n2 1 101 complete 40 40\n")
    assert report.healthy and report.verdict == "healthy: complete"
    assert report.chunks[0]["what"] == "finished the work (at 40/40)"
    lines = doctor_report.format_report(report)
    assert "no problem found" in lines[-1]


def test_nonfinite_values_in_a_run_that_ended_are_still_reported(tmp_path: Path) -> None:
    report = diagnose(tmp_path, "", status("COMPLETED", "0:0", ["started", "stopped"],
                                           chain_state="running"),
                      out="epoch 3: loss is nan\n")
    assert [f.cause for f in report.findings] == ["nonfinite"]
    assert report.findings[0].evidence[0].file.endswith("r-101.out")


def test_evidence_is_bounded_however_often_a_line_repeats(tmp_path: Path) -> None:
    err = "[Errno 28] No space left on device\n" * 10_000
    report = diagnose(tmp_path, err, status("FAILED", "1:0", ["started", "failed"]))
    f = report.findings[0]
    assert f.cause == "disk_full" and len(f.evidence) == 6
    assert f.evidence[-1].line == 10_000


def test_doctor_cli_bad_input_is_exit_2(tmp_path: Path) -> None:
    proc = run_cli(["doctor", "nope", "--runs", str(tmp_path)])
    assert proc.returncode == 2 and "no run named" in proc.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / contract.CHAIN_RECORD).write_text("{not json")
    proc = run_cli(["doctor", "junk", "--runs", str(tmp_path)])
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli(["doctor", "--runs", str(tmp_path / "empty")])
    assert proc.returncode == 2 and "no runs under" in proc.stderr


def test_unreadable_logs_are_no_traceback(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"r-101.out": ""})
    (run_dir / contract.LOG_DIR / "r-101.err").mkdir()  # not a file
    report = doctor_report.diagnose(load_chain(run_dir), status("FAILED", "2:0",
                                                             ["started", "failed"]))
    assert report.findings[0].cause == "unknown"


def test_status_all_is_one_row_per_run_with_the_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm is asked once for every run's jobs; a broken record is its own row."""
    from train.client.slurm import queue

    make_run(tmp_path, {"ok-201.out": ""}, name="ok")
    (tmp_path / "ok" / contract.PROGRESS_FILE).write_text("40 40\n")
    make_run(tmp_path, {"bad-301.err": "[Errno 28] No space left on device\n"}, name="bad")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / contract.CHAIN_RECORD).write_text("[")
    asked: list[list[str]] = []

    def job_states(ids: list[str]) -> dict[str, dict[str, Any]]:
        asked.append(sorted(ids))
        return {"201": {"state": "COMPLETED", "exit": "0:0"},
                "301": {"state": "FAILED", "exit": "1:0"}}

    monkeypatch.setattr(queue, "job_states", job_states)
    (tmp_path / "ok" / contract.CHAIN_EVENTS).write_text(
        "1795000000 1 201 started 0 0 40\n1795000100 1 201 complete 40 40\n")
    (tmp_path / "bad" / contract.CHAIN_EVENTS).write_text(
        "1795000000 1 301 started 0 0 40\n1795000100 1 301 failed 1\n")
    rows = {r["name"]: r for r in doctor_report.overview(tmp_path)}
    assert asked == [["201", "301"]]
    assert rows["ok"]["verdict"] == "healthy: complete" and rows["ok"]["done"] == 40
    assert rows["bad"]["verdict"].startswith("disk_full (chunk 1)")
    assert rows["broken"]["state"] == "unreadable" and "not valid JSON" in rows["broken"][
        "verdict"]
    table = doctor_report.format_overview(list(rows.values()))
    assert table[0].split()[:3] == ["NAME", "STATE", "PROGRESS"]
    assert any(line.startswith("ok ") and "40/40 (100%)" in line for line in table)


def test_status_all_takes_no_run_name(tmp_path: Path) -> None:
    proc = run_cli(["status", "x", "--all", "--runs", str(tmp_path)])
    assert proc.returncode == 2 and "--all" in proc.stderr


def _gpu_csv(run_dir: Path, node: str, utils: list[float], start: int = 1_795_000_000,
             every: int = 60) -> Path:
    """The watch's file (common/gpuwatch_file.py's format): one line per GPU per sample."""
    path = run_dir / "gpu" / f"{node}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["time,gpu,util_pct,mem_used_mib,mem_total_mib"]
    rows += [f"{start + i * every},0,{u:g},1000,81559" for i, u in enumerate(utils)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_idle_gpus_are_a_cause_with_the_samples_as_evidence(tmp_path: Path) -> None:
    res = {**RESOURCES, "gpu_watch": {"interval": 60, "idle_threshold": 60,
                                      "idle_minutes": 15}}
    run_dir = make_run(tmp_path, {"r-101.out": ""}, resources=res)
    # 10 busy minutes, then 20 minutes under Torch's 60% (its published cancel line)
    csv = _gpu_csv(run_dir, "n1", [95.0] * 10 + [40.0] * 21)
    st = status("RUNNING", None, ["started"], chain_state="running")
    report = doctor_report.diagnose(load_chain(run_dir), st)
    [f] = report.findings
    assert f.cause == "idle_gpu" and "n1 GPU 0" in f.detail and "--workers" in f.fix
    assert f.evidence[0].file == str(csv.absolute()) and f.evidence[0].line == 12
    # with the watch's default settings (10%) the same samples are no finding
    res["gpu_watch"] = None
    run_dir = make_run(tmp_path / "b", {"r-101.out": ""}, resources=res)
    _gpu_csv(run_dir, "n1", [95.0] * 10 + [40.0] * 21)
    assert doctor_report.diagnose(load_chain(run_dir), st).healthy


def test_status_shows_each_nodes_mean_and_latest_utilisation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from train.client.slurm import queue

    run_dir = make_run(tmp_path, {"r-101.out": ""})
    _gpu_csv(run_dir, "n1", [80.0, 60.0, 40.0])
    _gpu_csv(run_dir, "n2", [10.0, 30.0])
    monkeypatch.setattr(queue, "job_states",
                        lambda ids: {"101": {"state": "RUNNING", "reason": "None"}})
    st = chainstatus.chain_status(load_chain(run_dir))
    assert st["gpu"]["n1"]["mean_util"] == 60 and st["gpu"]["n1"]["latest_util"] == 40
    lines = chainstatus.format_status(st)
    assert "  gpu n1: 1 GPU(s), utilisation mean 60%, latest 40% (3 samples)" in lines
    assert any(line.startswith("  gpu n2: ") and "mean 20%" in line for line in lines)


def test_preflight_from_the_cli(tmp_path: Path) -> None:
    """`train doctor --preflight` runs the login-node checks (train/client/preflight.py, tested
    check by check in test_preflight.py): exit 0 when none failed, 1 when one did, 2 for
    bad input. The defaults of `train init` fill what is not given."""
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "PATH": "/usr/bin:/bin"}
    proc = run_cli(["doctor", "--preflight", "--cluster", "local", "--runtime", "none",
                    "--runs", str(tmp_path / "runs")], env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS  runs root" in proc.stdout
    # Torch needs apptainer (not on this PATH) and an account: two failures, each with a fix
    proc = run_cli(["doctor", "--preflight", "--cluster", "torch", "--json", "--runs",
                    str(tmp_path / "runs")], env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = {c["name"]: c for c in json.loads(proc.stdout)["checks"]
              if c["status"] == "fail"}
    assert {"container runtime", "account"} <= set(failed), failed
    assert all(c["fix"] for c in failed.values())
    for argv, words in ((["--preflight"], "cluster: --preflight needs the cluster"),
                        (["r", "--preflight", "--cluster", "local"], "give no run name"),
                        (["--preflight", "--cluster", "nowhere"], "nowhere")):
        proc = run_cli(["doctor", *argv, "--runs", str(tmp_path / "runs")], env=env)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_large_log_is_searched_in_its_head_and_tail_with_true_positions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes scaled down (the real ones: 256 MiB whole, else the first 32 and the last
    128 MiB): an import error at the start is found at its line, the OOM kill at the end
    at its byte offset (its line number would need the skipped middle read); a message in
    the middle only with full."""
    monkeypatch.setattr(logread, "WHOLE_LIMIT", 64 * 1024)
    monkeypatch.setattr(logread, "HEAD_BYTES", 8 * 1024)
    monkeypatch.setattr(logread, "TAIL_BYTES_SCANNED", 16 * 1024)
    lines = [f"progress line {i:06d} reward 1.0" for i in range(20_000)]
    lines[10] = "ModuleNotFoundError: No module named 'timm'"
    lines[10_000] = "[Errno 28] No space left on device"
    lines[-2] = CASES[0][3].strip()
    path = tmp_path / "x.err"
    path.write_text("\n".join(lines) + "\n")
    scan = logread.scan_log(path)
    assert not scan.whole and scan.skipped_bytes > 0
    assert [e.line for e in scan.hits["import_error"].evidence()] == [11]
    [oom] = scan.hits["host_oom"].evidence()
    text = path.read_bytes()
    assert oom.line == 0 and oom.offset == text.index(CASES[0][3].strip().encode())
    assert oom.where == f"{path} (byte {oom.offset})"
    assert "disk_full" not in scan.hits
    full = logread.scan_log(path, full=True)
    assert full.whole and [e.line for e in full.hits["disk_full"].evidence()] == [10_001]
    run_dir = make_run(tmp_path / "run", {"r-101.err": path.read_text()})
    report = doctor_report.diagnose(load_chain(run_dir), status("FAILED", "1:0"))
    assert any("--full searches every byte" in n for n in report.notes)
    assert report.findings[0].cause == "host_oom"


READ_COUNT = """
import json, sys
from pathlib import Path
from train.client.doctor import logread
logread.WHOLE_LIMIT, logread.HEAD_BYTES, logread.TAIL_BYTES_SCANNED = (
    8 << 20, 1 << 20, 4 << 20)

def rchar():
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])

before = rchar()
scan = logread.scan_log(Path(sys.argv[1]))
read = rchar() - before
print(json.dumps({"read": read, "skipped": scan.skipped_bytes, "hits": {
    cause: [e.as_dict() for e in hits.evidence()] for cause, hits in scan.hits.items()}}))
"""


def test_what_head_and_tail_mode_skips_is_never_read(tmp_path: Path) -> None:
    """Issue 18 item 8: a 600 MiB log with 440 MiB skipped read 1114 MiB (the skipped part
    was read to count its lines, the rest once per grep). Scaled down (64 MiB, the first
    1 MiB and the last 4 MiB searched) in a sparse file. rchar counts every read of this
    process and of the greps it has reaped (the kernel adds a reaped child's counts to its
    parent's): each searched byte is read once from the file here and once by each grep
    from its pipe, and a skipped byte never."""
    import os
    import subprocess
    import sys

    path = tmp_path / "big.err"
    head = "".join(f"step {i} loss 0.1\n" for i in range(100_000)).encode()  # > 1 MiB
    head = head.replace(b"step 10 loss 0.1\n", b"ModuleNotFoundError: No module named 'x'\n")
    size = 64 << 20
    tail = ("".join(f"step {i} loss 0.1\n" for i in range(300_000))
            + CASES[0][3]).encode()  # > 4 MiB, the OOM kill last
    with open(path, "wb") as fh:
        fh.write(head)
        fh.seek(size - len(tail) - 1)
        fh.write(b"\n" + tail)  # the middle is a hole: zeros, never written
    proc = subprocess.run([sys.executable, "-c", READ_COUNT, str(path)], capture_output=True,
                          text=True, check=True)
    got = json.loads(proc.stdout)
    searched = size - got["skipped"]
    assert 60 << 20 > got["skipped"] > 58 << 20, got["skipped"]
    greps = len(logread._groups(logread.RULES, min(2, len(os.sched_getaffinity(0)))))
    assert got["read"] < (1 + greps) * searched + (1 << 20), (got["read"], searched, greps)
    [imp] = got["hits"]["import_error"]
    assert imp["line"] == 11
    [oom] = got["hits"]["host_oom"]
    # in the tail the line number is unknown (counting it would read the middle): the
    # byte offset says where the line starts
    assert oom["offset"] == size - len(CASES[0][3]) and oom["line"] == 0


def test_a_matched_line_of_any_length_costs_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "x.err"
    with open(path, "w") as fh:
        fh.write("ImportError: " + "x" * (3 << 20) + "\n")  # 3 MiB in one line
        # digits and a colon, after the long line: its own line number, not a misread one
        fh.write("12:34 slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-11-22T10:00:00 "
                 "DUE TO TIME LIMIT ***\n")
    hits = logread.scan_log(path).hits
    [imp] = hits["import_error"].evidence()
    assert imp.line == 1 and len(imp.text) <= logread.MAX_LINE + 6  # and the "..."s
    assert [e.line for e in hits["walltime"].evidence()] == [2]


# the hostile trial's misdiagnoses: ordinary words in a log never beat the real cause
TRACEBACK = ("Traceback (most recent call last):\n  File \"fit.py\", line 9, in <module>\n"
             "ValueError: bad shape (3, 4)\n")


@pytest.mark.parametrize(("err", "out"), [
    ("Warning: ImportError: apex not installed, using torch AMP\n" + TRACEBACK, ""),
    (TRACEBACK, "reading /data/MemoryError_logs/x.json\n"),
    (TRACEBACK, "the run will stop DUE TO TIME LIMIT of its budget\nnon-finite grads "
     "skipped: 0\n/data/OutOfMemoryError_benchmark/a.bin\n"),
])
def test_a_word_in_a_log_is_not_a_cause(tmp_path: Path, err: str, out: str) -> None:
    report = diagnose(tmp_path, err, status("FAILED", "1:0", ["started", "failed"]), out=out)
    assert [f.cause for f in report.findings] == ["python_error"], report.as_dict()
    assert report.findings[0].detail == "ValueError: bad shape (3, 4)"


def test_a_healthy_run_with_alarming_words_is_healthy(tmp_path: Path) -> None:
    out = ("loading /data/OutOfMemoryError_benchmark/a.bin\nnon-finite grads skipped: 0\n"
           "batch 512: CUDA out of memory, retrying with 256\n"  # a recovered search
           "the run will stop DUE TO TIME LIMIT of its budget\n")
    report = diagnose(tmp_path, "", status("COMPLETED", "0:0", ["started", "complete"],
                                           chain_state="complete"), out=out)
    assert report.healthy, report.as_dict()


def test_a_scancelled_job_is_not_a_walltime_for_a_word(tmp_path: Path) -> None:
    report = diagnose(tmp_path, "the run will stop DUE TO TIME LIMIT of its budget\n",
                      status("CANCELLED", "0:15", ["started", "terminated"]))
    assert [f.cause for f in report.findings] == ["cancelled"], report.verdict


@pytest.mark.parametrize("line", [
    "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [10.0.0.2]:4432",
    "1: ZeroDivisionError: division by zero",  # srun --label
    "[1,0]<stderr>:KeyError: 'lr'",  # Open MPI
])
def test_a_rank_prefixed_exception_is_the_cause(tmp_path: Path, line: str) -> None:
    report = diagnose(tmp_path, "start\n" + line + "\n", status("FAILED", "1:0"))
    f = report.findings[0]
    assert f.cause == "python_error" and f.evidence[0].line == 2, report.as_dict()


def test_the_last_exception_leads_when_a_rule_knows_it(tmp_path: Path) -> None:
    err = ("warning: [Errno 28] No space left on device (cache, ignored)\n"
           "Traceback (most recent call last):\n"
           "ModuleNotFoundError: No module named 'timm'\n")
    report = diagnose(tmp_path, err, status("FAILED", "1:0", ["started", "failed"]))
    assert [f.cause for f in report.findings] == ["import_error", "disk_full"]
    assert report.findings[0].evidence[-1].line == 3


def test_a_keyword_deep_in_a_long_json_line_is_found(tmp_path: Path) -> None:
    line = '{"pad": "' + "x" * 3000 + '", "error": "[Errno 28] No space left on device"}'
    report = diagnose(tmp_path, line + "\n", status("FAILED", "1:0"))
    f = report.findings[0]
    assert f.cause == "disk_full" and "No space left" in f.evidence[0].text
    assert len(f.evidence[0].text) <= logread.MAX_LINE + 6


def test_control_characters_in_logs_and_names_are_escaped(tmp_path: Path) -> None:
    err = "ImportError: \x1b]0;owned\x07\x1b[2J cleared\r\n"
    run_dir = make_run(tmp_path, {"r-101.err": err}, name="r")
    record = json.loads((run_dir / contract.CHAIN_RECORD).read_text())
    record["name"] = "r\x1b[2J\nok  complete"
    (run_dir / contract.CHAIN_RECORD).write_text(json.dumps(record))
    report = doctor_report.diagnose(load_chain(run_dir), status("FAILED", "1:0"))
    text = "\n".join(doctor_report.format_report(report))
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "\\x1b" in text
    table = "\n".join(doctor_report.format_overview([{"name": record["name"], "state": "failed",
                                               "done": 1, "total": 2, "gpu": {},
                                               "verdict": "x\x1by"}]))
    assert "\x1b" not in table and len(table.splitlines()) == 2


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_run_files_that_are_fifos_or_devices_never_hang(tmp_path: Path, kind: str) -> None:
    """Every file of a run directory is read bounded and only when regular: a FIFO would
    block a reader forever, a link to /dev/zero would fill memory."""
    import os

    run_dir = make_run(tmp_path, {"r-101.err": "[Errno 28] No space left on device\n"})
    for name in (contract.CHAIN_EVENTS, contract.PROGRESS_FILE, "status.json"):
        if kind == "fifo":
            os.mkfifo(run_dir / name)
        else:
            (run_dir / name).symlink_to("/dev/zero")
    st = status("FAILED", "1:0", ["started", "failed"])
    report = doctor_report.diagnose(load_chain(run_dir), st)
    assert report.findings[0].cause == "disk_full" and report.training == {}
    (run_dir / contract.CHAIN_IDS).unlink()
    if kind == "fifo":
        os.mkfifo(run_dir / contract.CHAIN_IDS)
    else:
        (run_dir / contract.CHAIN_IDS).symlink_to("/dev/zero")
    with pytest.raises(UsageError, match=r"chain\.ids is unreadable or damaged"):
        load_chain(run_dir)
    other = tmp_path / "other"
    other.mkdir()
    if kind == "fifo":
        os.mkfifo(other / contract.CHAIN_RECORD)
    else:
        (other / contract.CHAIN_RECORD).symlink_to("/dev/zero")
    from train.client.slurm.chain import chain_dirs

    assert other not in chain_dirs(tmp_path)


def test_without_slurm_the_events_still_diagnose(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue and sacct unreachable: a note says so, and the chain's events decide."""
    from train.client.slurm import queue
    from train.common.errors import ResourceError

    def no_slurm(ids: list[str]) -> dict[str, Any]:
        raise ResourceError("cannot reach Slurm: squeue: connection refused")

    monkeypatch.setattr(queue, "job_states", no_slurm)
    run_dir = make_run(tmp_path, {"r-101.err": TRACEBACK})
    (run_dir / contract.CHAIN_EVENTS).write_text(
        "1795000000 1 101 started 0 0 40\n1795000100 1 101 failed 1\n")
    report = doctor_report.diagnose(load_chain(run_dir))
    assert report.findings[0].cause == "python_error", report.as_dict()
    assert any("Slurm could not be asked" in n for n in report.notes)
    rows = doctor_report.overview(tmp_path)
    assert rows[0]["verdict"].startswith("python_error") and rows[0]["slurm"]


def test_a_chain_with_no_jobs_is_a_finding(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {})
    (run_dir / contract.CHAIN_IDS).write_text("")  # (one that is no file: load_chain says)
    report = doctor_report.diagnose(load_chain(run_dir), {"name": "r", "state": "ended",
                                                       "cause": "-", "chunks": []})
    assert [f.cause for f in report.findings] == ["no_jobs"]


@pytest.mark.parametrize("listing", [["--all"], [], ["--json"]])
def test_status_of_a_runs_root_that_is_not_a_folder_is_said(tmp_path: Path,
                                                            listing: list[str]) -> None:
    """`train status --runs /nonexistent` printed nothing and exited 0: a mistyped --runs
    read as no runs. A file there is exit 2; a folder that does not exist (yet: a new
    user's default `runs`) is said, exit 0; a folder with no runs in it is no error."""
    (tmp_path / "file").write_text("x")
    proc = run_cli(["status", *listing, "--runs", str(tmp_path / "file")])
    assert proc.returncode == 2 and f"--runs: {tmp_path / 'file'} is not a folder" in \
        proc.stderr, proc.stderr
    proc = run_cli(["status", *listing, "--runs", str(tmp_path / "missing")])
    assert proc.returncode == 0, proc.stderr
    if "--json" in listing:
        assert json.loads(proc.stdout) == [], proc.stdout
    else:
        assert f"no runs: {tmp_path / 'missing'} does not exist" in proc.stdout, proc.stdout
    (tmp_path / "empty").mkdir()
    proc = run_cli(["status", *listing, "--runs", str(tmp_path / "empty")])
    assert proc.returncode == 0 and not proc.stderr, proc.stderr


def test_json_output_stays_strict_json(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"r-101.out": ""})
    (run_dir / "status.json").write_text('{"complete": false, "loss": NaN}')
    report = doctor_report.diagnose(load_chain(run_dir), status("RUNNING", None,
                                                             chain_state="running"))
    text = json.dumps(report.as_dict(), allow_nan=False)  # raises on NaN
    assert json.loads(text)["training"] == {"complete": False, "loss": None}


def test_a_missing_module_under_runtime_none_names_the_python_not_an_image(
        tmp_path: Path) -> None:
    """Issue 39: a job of the nodes' own Python (--runtime none --python P) has no image
    to rebuild: the fix installs the module into P's environment."""
    res = {**RESOURCES, "runtime": "none", "image": None, "python": "/scratch/env/bin/python"}
    err = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'torch'\n"
    report = diagnose(tmp_path, err, status("FAILED", "1:0", ["started", "failed"]),
                      resources=res)
    first = report.findings[0]
    assert first.cause == "import_error", report.verdict
    assert "/scratch/env/bin/python -m pip install torch" in first.fix, first.fix
    assert "image" not in first.title and "rebuild" not in first.fix, first
    with_image = diagnose(tmp_path / "img", err, status("FAILED", "1:0"),
                          resources={**res, "runtime": "apptainer", "image": "/x.sif"})
    assert "rebuild the image" in with_image.findings[0].fix


def test_a_healthy_chain_queued_for_hours_has_no_idle_gpu(tmp_path: Path) -> None:
    """Issue 18 item 7: three chunks, each idle while it starts and while it saves, 3 hours
    of queue between them (the real sampler loop wrote the file): healthy, exit 0."""
    from tests.unit.test_gpuwatch import HEALTHY_CHUNK, _chain_of_samplers

    res = {**RESOURCES, "gpu_watch": {"interval": 30, "idle_threshold": 60,
                                      "idle_minutes": 15}}
    run_dir = make_run(tmp_path, {"r-101.out": ""}, resources=res)
    _chain_of_samplers(run_dir, [HEALTHY_CHUNK] * 3)
    st = status("COMPLETED", "0:0", ["started", "complete"], chain_state="complete")
    report = doctor_report.diagnose(load_chain(run_dir), st)
    assert report.healthy, report.as_dict()


# -- under torchrun (issue 18 item 6) ---------------------------------------------------
# Real job stderr captured from torch 2.13's elastic agent (tests/unit/doctor_logs/, each
# file's first line says how; the workers are these programs):
TORCHRUN_WORKERS = {
    "torchrun_oom.err": "rank 1: raise torch.OutOfMemoryError('CUDA out of memory. ...')",
    "torchrun_record_oom.err": "the same inside main() decorated with errors.record",
    "torchrun_tee_oom.err": "rank 1: raise RuntimeError('CUDA out of memory. ...'), --tee 3",
    "torchrun_two_ranks.err": "rank 1: the OOM; rank 0, 0.3 s later: a gloo RuntimeError",
    "torchrun_sigkill.err": "rank 1: os.kill(os.getpid(), SIGKILL)",
    "gloo_teardown_abort.err": "a real 2-node CPU job; rank 1: std::terminate at exit",
}
LOGS = Path(__file__).parent / "doctor_logs"


@pytest.mark.parametrize("name", ["torchrun_oom.err", "torchrun_record_oom.err",
                                  "torchrun_tee_oom.err", "torchrun_two_ranks.err"])
def test_under_torchrun_the_ranks_cause_leads_not_the_agents_wrapper(
        tmp_path: Path, name: str) -> None:
    err = (LOGS / name).read_text()
    assert "ChildFailedError" in err and "Root Cause (first observed failure)" in err
    report = diagnose(tmp_path, err, status("FAILED", "1:0", ["started", "failed"]))
    assert report.findings[0].cause == "gpu_oom", report.verdict
    assert "python_error" not in [f.cause for f in report.findings], report.verdict
    assert any("CUDA out of memory" in e.text for e in report.findings[0].evidence)
    assert all("ChildFailedError" not in f.detail for f in report.findings)


def test_gloos_abort_at_teardown_is_named_with_submit_again_and_no_gpu_advice(
        tmp_path: Path) -> None:
    """Issue 39: a CPU job whose rank aborted as gloo's group was torn down, after its
    work, was sent to CUDA, NCCL and GPU checks (native_crash)."""
    err = (LOGS / "gloo_teardown_abort.err").read_text()
    out = "rank 1 done at step 20; weight sum 8.000000\nrank 0 done at step 20; weight sum 8.000000\n"
    cpu = {**RESOURCES, "gpus_per_node": 0, "launch": "torchrun", "processes_per_node": 1}
    report = diagnose(tmp_path, err, status("FAILED", "134:0", ["started", "failed"]),
                      out=out, resources=cpu)
    first = report.findings[0]
    assert first.cause == "teardown_abort", report.verdict
    assert "submit the same command again" in first.fix, first.fix
    assert "native_crash" not in [f.cause for f in report.findings], report.verdict
    said = " ".join(f"{f.title} {f.fix}" for f in report.findings)
    assert not any(w in said for w in ("CUDA", "NCCL", "GPU", "nvidia")), said
    assert any("terminate called without an active exception" in e.text
               for e in first.evidence)


def test_a_rank_killed_under_torchrun_is_a_sigkill_of_that_rank(tmp_path: Path) -> None:
    err = (LOGS / "torchrun_sigkill.err").read_text()
    report = diagnose(tmp_path, err, status("FAILED", "1:0", ["started", "failed"]))
    f = report.findings[0]
    assert f.cause == "sigkill", report.verdict
    assert "rank 1" in f.detail and "SIGKILL" in f.detail, f.detail
    assert "python_error" not in [x.cause for x in report.findings]



def documented_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """What `train doctor fit1` prints for a 4-GPU torchrun job whose rank 1 ran out of GPU
    memory while rank 0 failed after it (torchrun_two_ranks.err; torch names rank 0 the
    root cause), as sacct and the chain's events tell it; the project's folder shown as
    ~/proj."""
    monkeypatch.chdir(tmp_path)
    res = {**RESOURCES, "launch": "torchrun", "ntasks_per_node": 1, "workers": 0,
           "batch_size": None}
    run_dir = make_run(Path("runs"), {"fit1-101.err": (LOGS / "torchrun_two_ranks.err")
                                      .read_text(), "fit1-101.out": ""},
                       name="fit1", resources=res)
    record = json.loads((run_dir / contract.CHAIN_RECORD).read_text())
    (run_dir / contract.CHAIN_RECORD).write_text(json.dumps({**record, "entry": "command"}))
    (run_dir / contract.CHAIN_EVENTS).write_text(
        "1795000000 1 101 started 0 0 0\n1795000600 1 101 failed 1 gpu-a017\n")
    chain = load_chain(run_dir)
    report = doctor_report.diagnose(chain, chain_status(chain, {"101": {"state": "FAILED",
                                                                         "exit": "1:0"}}))
    text = "\n".join(doctor_report.format_report(report))
    return text.replace(str(tmp_path.resolve()), "~/proj")


def test_the_report_docs_doctor_shows_is_what_the_doctor_prints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from tests.conftest import REPO

    page = (REPO / "docs" / "doctor.md").read_text()
    shown = re.search(r"```text\n\$ train doctor fit1\n(.*?)```", page, re.S)
    assert shown is not None, "docs/doctor.md shows no report of `train doctor fit1`"
    assert shown.group(1).rstrip("\n") == documented_report(tmp_path, monkeypatch)


OOM_RANK = """
import os
import torch
if os.environ["RANK"] == "1":
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has "
                                 "a total capacity of 79.10 GiB of which 1.06 GiB is free.")
"""


@pytest.mark.slow
def test_a_real_torchrun_whose_rank_runs_out_of_gpu_memory(tmp_path: Path) -> None:
    """torch's own agent (CPU, 2 ranks, no rendezvous beyond this machine's loopback):
    rank 1 raises torch's OOM; rank 0 ends at once without error."""
    import os
    import subprocess
    import sys

    script = tmp_path / "w.py"
    script.write_text(OOM_RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "--monitor-interval", "0.2",
                           str(script)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "ChildFailedError" in proc.stderr, proc.stderr[-3000:]
    report = diagnose(tmp_path, proc.stderr, status("FAILED", "1:0", ["started", "failed"]))
    assert report.findings[0].cause == "gpu_oom", report.as_dict()
    assert "python_error" not in [f.cause for f in report.findings]


# -- host memory and the field notes' 16-GPU job (issue 18 item 9) ----------------------
# seed 003: NYU Torch, 4 nodes x 4 L40S, 256 GB nodes, num_workers=8 per GPU: "Detected 5
# oom_kill events"; the fix that worked was 2 workers per GPU. Lightning printed its
# rendezvous lines (lightning_fabric/utilities/distributed.py: "Initializing distributed:
# GLOBAL_RANK: r, MEMBER: r+1/W" from each rank's logger, where only rank 0's is shown, and
# rank_zero_info "All distributed processes registered. Starting with W processes").
SEED_003 = {"nodes": 4, "processes_per_node": 4, "gpus_per_node": 4, "ntasks_per_node": 4,
            "launch": "tasks", "workers": 8, "worker_mem_mb": 4096, "mem_mb": 256000,
            "node_mem_mb": 262144, "batch_size": None}
SEED_003_ERR = (
    "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/16\n"
    + "-" * 100 + "\ndistributed_backend=nccl\n"
    "All distributed processes registered. Starting with 16 processes\n" + "-" * 100 + "\n"
    "Epoch 0:   3%|          | 120/3865 [04:10<2:10:11,  0.48it/s, v_num=0]\n"
    "slurmstepd: error: Detected 5 oom_kill events in StepId=269582.0. Some of the step "
    "tasks have been OOM Killed.\n")


@pytest.mark.parametrize("mem_mb", [256000, 262144])  # --mem 250G, and the whole node
def test_the_field_notes_host_oom_is_told_fewer_workers(tmp_path: Path, mem_mb: int) -> None:
    res = {**SEED_003, "mem_mb": mem_mb}
    report = diagnose(tmp_path, SEED_003_ERR, status("OUT_OF_MEMORY", "0:125"), resources=res)
    assert [f.cause for f in report.findings] == ["host_oom"], report.verdict
    fix = report.findings[0].fix
    assert fix.startswith("--workers 2"), fix
    assert "or more --mem" not in fix, fix


def test_a_whole_node_job_is_never_told_more_mem(tmp_path: Path) -> None:
    # 2 workers x 4 processes fit by the per-worker figure, but the job has the whole node:
    # fewer workers first, then what the program itself holds
    res = {**SEED_003, "workers": 2, "mem_mb": 262144}
    report = diagnose(tmp_path, SEED_003_ERR, status("OUT_OF_MEMORY", "0:125"), resources=res)
    fix = report.findings[0].fix
    assert fix.startswith("--workers 1"), fix
    assert "or more --mem" not in fix and "more --mem cannot help" in fix, fix


def test_a_small_job_with_few_workers_is_told_more_mem(tmp_path: Path) -> None:
    res = {**SEED_003, "workers": 1, "processes_per_node": 1, "mem_mb": 32768}
    report = diagnose(tmp_path, SEED_003_ERR, status("OUT_OF_MEMORY", "0:125"), resources=res)
    fix = report.findings[0].fix
    assert fix.startswith("more --mem"), fix
    assert "256G" in fix  # up to the node's memory


def test_a_completed_lightning_rendezvous_is_no_rendezvous_finding(tmp_path: Path) -> None:
    report = diagnose(tmp_path, SEED_003_ERR, status("OUT_OF_MEMORY", "0:125"),
                      resources=SEED_003)
    assert "rendezvous" not in [f.cause for f in report.findings], report.as_dict()
    # the same member line without the group's completion is still a partial rendezvous
    err = "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/16\n" + CASES[0][3]
    report = diagnose(tmp_path / "b", err, status("FAILED", "1:0", ["started", "failed"]),
                      resources=SEED_003)
    rdv = [f for f in report.findings if f.cause == "rendezvous"]
    assert rdv and "1 of 16" in rdv[0].detail, report.as_dict()


# A requeued job (--requeue) appends each run to the same log: the group that met in an
# earlier run says nothing of the run that failed. A hostile trial found an earlier run's
# "All distributed processes registered" hiding the last run's stuck rendezvous (the
# 1/16-clients timeout reported as an unknown failure, a cancelled wait as no finding).
REQUEUED_RUN_0 = (
    "16:00:00 train-job[1]: job 101 (restart 0) on n[1-4], 4 node(s); chunk 1 of at most 3\n"
    "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/16\n"
    "All distributed processes registered. Starting with 16 processes\n"
    "Epoch 0:  10%\n"
    "16:50:00 train-job[1]: checkpoint written (10 100); requeueing job 101\n"
    "17:00:00 train-job[1]: job 101 (restart 1) on n[1-3,5], 4 node(s); chunk 1 of at most 3\n"
    "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/16\n")


@pytest.mark.parametrize("end, state, detail", [
    ("torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. "
     "1/16 clients joined.\n", status("FAILED", "1:0", ["started", "failed"]), "1 of 16"),
    ("", status("CANCELLED", "0:15", ["started", "terminated"]), "of 16 ranks"),
])
def test_an_earlier_runs_rendezvous_does_not_hide_the_last_runs(
        tmp_path: Path, end: str, state: dict[str, Any], detail: str) -> None:
    report = diagnose(tmp_path, REQUEUED_RUN_0 + end, state, resources=SEED_003)
    rdv = [f for f in report.findings if f.cause == "rendezvous"]
    assert rdv and detail in rdv[0].detail, report.as_dict()
    # and the group that met after its members announced themselves is still no finding
    met = REQUEUED_RUN_0 + "All distributed processes registered. Starting with 16 processes\n"
    report = diagnose(tmp_path / "met", met, state, resources=SEED_003)
    assert "rendezvous" not in [f.cause for f in report.findings], report.as_dict()


# The field notes' case as it was run: the user's own Lightning script (--entry command),
# whose DataLoader workers (num_workers=8 per GPU) train neither sets nor records (workers
# 0 in the record). A hostile trial found the doctor blaming "the training processes
# themselves" on the whole node and "more --mem" otherwise, never the program's workers.
@pytest.mark.parametrize("mem_mb", [262144, 128000])
def test_a_commands_own_dataloader_workers_are_named_for_a_host_oom(
        tmp_path: Path, mem_mb: int) -> None:
    res = {**SEED_003, "workers": 0, "mem_mb": mem_mb}
    run_dir = make_run(tmp_path, {"r-101.err": SEED_003_ERR, "r-101.out": ""}, resources=res)
    record = json.loads((run_dir / contract.CHAIN_RECORD).read_text())
    (run_dir / contract.CHAIN_RECORD).write_text(json.dumps({**record, "entry": "command"}))
    report = doctor_report.diagnose(load_chain(run_dir), status("OUT_OF_MEMORY", "0:125"))
    fix = report.findings[0].fix
    assert report.findings[0].cause == "host_oom", report.verdict
    assert fix.startswith("fewer DataLoader workers in the program"), fix
    assert "num_workers" in fix, fix


def test_the_chain_record_keeps_the_nodes_memory_for_the_doctor() -> None:
    import sys

    from train.client.clusters.profiles import Registry
    from train.client.slurm.jobspec import JobSpec
    from train.client.slurm.resolve import resolve

    spec = JobSpec(cluster="torch", account="torch_pr_1_x", constraint="l40s", nodes=4,
                   gpus_per_node=4, launch="tasks", workers=2, mem="250G", workload=("demo",),
                   runtime="none", python=sys.executable)
    res = resolve(spec, Registry(environ={}).get("torch")).resources()
    assert res["node_mem_mb"] == 262144 and res["mem_mb"] == 256000


def test_a_chunk_stopped_before_any_save_is_named_with_the_fix(tmp_path: Path) -> None:
    """The batch shell's 'unsaved' event (a stop with nothing saved since the chunk began):
    the doctor says so and what to change, instead of calling the chain healthy or
    unknown."""
    st = status("COMPLETED", "0:0", ["started", "unsaved"], chain_state="stalled")
    report = diagnose(tmp_path, "", st, events="1 1 101 started 0 0 0\n2 1 101 unsaved 0 0\n")
    f = report.findings[0]
    assert f.cause == "unsaved" and "--save-path" in f.fix and "--time" in f.fix
    assert "stopped before any save" in report.chunks[0]["what"]
    assert not report.healthy


# Lightning's rank-zero banner, as 2.x prints it (rank_zero_info in its accelerator
# connector): global rank 0 only
BANNER = ("GPU available: False, used: False\nTPU available: False, using: 0 TPU cores\n"
          "HPU available: False, using: 0 HPUs\n")


def test_every_process_alone_at_world_size_1_is_flagged(tmp_path: Path) -> None:
    """A bare Trainer() on a 2-node job: each process is rank 0 of its own world, prints
    the banner, trains the whole model, and the chain completes 'healthy'."""
    res = {**RESOURCES, "nodes": 2, "processes_per_node": 1, "ntasks_per_node": 1}
    done = status("COMPLETED", "0:0", ["started", "complete"], chain_state="complete")
    report = diagnose(tmp_path, "", done, out=BANNER * 2, resources=res)
    f = report.findings[0]
    assert f.cause == "ranks_alone" and "2 processes" in f.detail
    assert "num_nodes" in f.fix and not report.healthy
    # the same job as one group: rank 0 alone prints it, once a run (a requeued run too)
    for runs in (1, 2):
        events = ["started"] * runs + ["complete"]
        ok = diagnose(tmp_path / f"ok{runs}", "", status("COMPLETED", "0:0", events,
                                                         chain_state="complete"),
                      out=BANNER * runs, resources=res)
        assert ok.healthy, ok.verdict


@pytest.mark.parametrize("line", ["101|FAILED|0:9", "101|FAILED|137:0"])
def test_sacct_tells_a_sigkill_either_way_its_versions_write_it(tmp_path: Path,
                                                                line: str) -> None:
    """Slurm before 25.11 writes a SIGKILLed job's ExitCode as 0:9, 25.11 and later as
    137:0: both are the same kill, read from sacct's own line."""
    from train.client.slurm.queue import parse_sacct

    sacct = parse_sacct(f"{line}\n101.batch|FAILED|{line.rsplit('|', 1)[1]}\n")["101"]
    report = diagnose(tmp_path, "", status(sacct["state"], sacct["exit"],
                                           ["started", "failed"]))
    assert report.findings[0].cause == "sigkill", report.verdict


def test_the_first_failing_tasks_code_and_node_are_what_doctor_says(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"r-101.err": "boom\n"})
    (run_dir / contract.CHAIN_EVENTS).write_text(
        "1 1 101 started 0 0 0\n2 1 101 failed 1 node-b\n")
    chain = load_chain(run_dir)
    st = chain_status(chain, {"101": {"state": "FAILED"}})  # (no sacct exit code)
    report = doctor_report.diagnose(chain, st)
    assert "exited with code 1 on node node-b" in "\n".join(doctor_report.format_report(report))
    assert report.chunks[0]["exit"] == "1:0"


def _kill_chain(tmp_path: Path, events: str, ids: str, **record: Any) -> doctor_report.Report:
    """A --stop-mode kill chain of a command, its events and Slurm's states as given."""

    run_dir = make_run(tmp_path, {})
    (run_dir / contract.CHAIN_RECORD).write_text(json.dumps(
        {"name": "r", "cluster": "local", "max_chunks": 3, "entry": "command",
         "stop_mode": "kill", **record}))
    (run_dir / contract.CHAIN_IDS).write_text(ids)
    (run_dir / contract.CHAIN_EVENTS).write_text(events)
    chain = load_chain(run_dir)
    states = {i: {"state": "COMPLETED"} for i in chain.ids}
    return doctor_report.diagnose(chain, chain_status(chain, states))


def test_chunks_that_start_over_from_the_same_save_are_a_finding(tmp_path: Path) -> None:
    """Saves further apart than a chunk, stopped by the tool: each chunk goes on from the
    save the one before went on from. Progress unknown: the doctor cannot call it healthy
    and send the user to a larger --max-chunks; progress known: it names it."""
    report = _kill_chain(tmp_path, "1 1 10 started 0 0 0\n2 1 10 stopped 0 0\n"
                         "3 2 11 started 0 0 0\n4 2 11 stopped 0 0\n"
                         "5 3 12 started 0 0 0\n6 3 12 incomplete 0 0\n",
                         "1 10\n2 11\n3 12\n")
    assert not report.healthy
    f = report.findings[0]
    assert (f.cause, f.chunk) == ("resume_unverified", 3)
    assert "save more often than once a chunk" in f.fix and "--max-chunks" in f.fix
    assert report.chunks[0]["what"] == "stopped after a save; chunk 2 goes on from it"
    report = _kill_chain(tmp_path / "known", "1 1 10 started 0 0 0\n2 1 10 stopped 500 0\n"
                         "3 2 11 started 0 500 0\n4 2 11 no_progress 500 0\n", "1 10\n2 11\n")
    assert [(f.cause, f.chunk) for f in report.findings] == [("repeated_work", 2)]
    assert "save more often than once a chunk" in report.findings[0].fix
    assert "went on from where chunk 1 stopped (at step 500)" in report.findings[0].detail
