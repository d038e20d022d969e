"""How a chunk's tasks end, on the REAL local Slurm cluster: the program's own exit code
across two nodes (never the TERM Slurm sent the other task after the first failed), a
`--save-path .` that holds the run folder (the tool's own files are no save), and the
node's temporary folder after a chunk stopped by its stop signal and one ended at the
walltime (nothing of the job left: no train-job.*, no torchelastic_*).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.integration.chains import (
    ENDLESS,
    TERMINAL,
    logs,
    running_chunk,
    submit,
    wait,
    walltime_signal,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NANO = Path(__file__).with_name("nanogpt_like.py")

# both ranks exit 1: rank 0 at once, rank 1 a moment later (or the TERM Slurm sends it
# once rank 0 failed comes first); neither before both have started
BOTH_FAIL = """import os, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
Path(f"started.{rank}").touch()
while not all(Path(f"started.{r}").exists() for r in (0, 1)):
    time.sleep(0.05)
if rank == 1:
    time.sleep(0.5)
print(f"rank {rank} gives up", file=sys.stderr, flush=True)
sys.exit(1)
"""


def _ended(cwd: Path, env: dict[str, str], name: str) -> dict[str, Any]:
    return wait(cwd, env, name, lambda s: s["state"] in TERMINAL and all(
        c["state"] not in ("PENDING", "RUNNING", "COMPLETING") for c in s["chunks"]),
        timeout=300)


def test_both_ranks_failing_on_two_nodes_report_the_programs_code_and_node(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    (tmp_path / "fail.py").write_text(BOTH_FAIL)
    job_tmp = tmp_path / "job-tmp"
    job_tmp.mkdir()
    env = {**slurm_env, "TMPDIR": str(job_tmp)}
    run_dir = submit(tmp_path, env, "both", ["--entry", "command", "--nodes", "2",
                                             "--launch", "tasks", "--time", "5"],
                     [sys.executable, "fail.py"])
    st = _ended(tmp_path, env, "both")
    err = logs(run_dir)
    assert st["state"] == "failed", (st, err[-3000:])
    assert re.search(r"exited with code 1 on node \S+; see", st["cause"]), st["cause"]
    assert re.search(r"training step failed with exit code 1 on node \S+", err), err[-3000:]
    failed = [line.split() for line in (run_dir / "chain.events").read_text().splitlines()
              if line.split()[3:4] == ["failed"]]
    assert [f[4] for f in failed] == ["1"], failed
    doctor = run_cli(["doctor", "both"], cwd=tmp_path, env=env)
    assert re.search(r"exited with code 1 on node \S+", doctor.stdout), doctor.stdout
    assert [p.name for p in job_tmp.iterdir()] == []
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".chunk-")]


@pytest.mark.parametrize("saves", [False, True])
def test_save_path_dot_counts_the_programs_checkpoint_never_the_tools_files(
        tmp_path: Path, slurm_env: dict[str, str], saves: bool) -> None:
    # nanoGPT's shape with its checkpoint in the submit folder itself (--out_dir=.); what
    # the test reads of it goes outside that folder
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir()
    shutil.copy(NANO, submit_dir / "nanogpt_like.py")
    log_dir = tmp_path / "log"
    block = 7 if saves else 3  # a save every 5 iterations: after the stop, or none
    run_dir = submit(submit_dir, slurm_env, "dot",
                     ["--entry", "command", "--time", "10", "--signal-margin", "30",
                      "--stop-mode", "kill", "--resume-args", "--init_from=resume",
                      "--save-path", ".", "--max-chunks", "2"],
                     [sys.executable, "nanogpt_like.py", "--out_dir=.",
                      f"--log_dir={log_dir}", "--max_iters=10", "--eval_interval=5",
                      f"--block_after={block}"])
    st = wait(submit_dir, slurm_env, "dot",
              lambda s: any(log_dir.glob("blocked.*")), timeout=300)
    walltime_signal(st["chunks"][0]["job_id"], slurm_env)
    st = _ended(submit_dir, slurm_env, "dot")
    err = logs(run_dir)
    runs = (log_dir / "runs.log").read_text().splitlines()
    if saves:  # chunk 2 resumed from the checkpoint chunk 1 wrote in the submit folder
        assert st["state"] == "complete", (st, err[-4000:])
        assert len(runs) == 2 and "--init_from=resume" in runs[1]
        return
    assert st["state"] == "stalled", (st, err[-4000:])
    assert "stopped before any save" in st["cause"], st
    assert len(runs) == 1  # no chunk 2, and no --resume-args for a run with nothing saved
    assert not (run_dir / "checkpointed").exists()


def test_a_stopped_chunk_and_one_ended_at_its_walltime_leave_nothing_in_the_nodes_tmp(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    job_tmp = tmp_path / "job-tmp"
    job_tmp.mkdir()
    env = {**slurm_env, "TMPDIR": str(job_tmp)}
    # torch's launcher, stopped by the stop signal (a checkpointed stop at its bound)
    submit(tmp_path, env, "stop", ["--launch", "torchrun", "--cpus-per-task", "2",
                                   "--time", "10", "--max-chunks", "1"], ENDLESS)
    job = running_chunk(tmp_path, env, "stop", 1, min_episode=25)
    walltime_signal(job["job_id"], env)
    # a worker with no handler for the stop signal: the walltime's TERM ends it
    deaf = tmp_path / "deaf.py"
    deaf.write_text("import signal, time\nsignal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
                    "while True:\n    time.sleep(1)\n")
    run_dir = submit(tmp_path, env, "late", ["--entry", "command", "--launch", "torchrun",
                                             "--cpus-per-task", "2", "--time", "1"],
                     [sys.executable, str(deaf)])
    stopped = _ended(tmp_path, env, "stop")
    assert stopped["state"] == "incomplete", stopped
    late = _ended(tmp_path, env, "late")
    assert late["chunks"][0]["state"] == "TIMEOUT" or "walltime" in late["cause"], late
    assert "reached its walltime" in logs(run_dir) or "walltime" in late["cause"]
    left = sorted(p.name for p in job_tmp.iterdir())
    assert left == [], left
    for name in ("stop", "late"):
        folder = tmp_path / "runs" / name
        assert not [p for p in folder.iterdir() if p.name.startswith(".chunk-")], name


# a program with no handler for anything: it ignores TERM (and the stop signal), and
# saves as it goes
DEAF = """import signal, sys, time
from pathlib import Path
for sig in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(sig, signal.SIG_IGN)
Path(sys.argv[1]).touch()
while True:
    Path("out").mkdir(exist_ok=True)
    Path("out/ckpt").write_text(str(time.time()))
    time.sleep(0.5)
"""


@pytest.mark.parametrize("end", ["kill", "cancel"])
def test_a_chunk_ended_by_kill_leaves_nothing_in_the_nodes_tmp(
        tmp_path: Path, slurm_env: dict[str, str], end: str) -> None:
    # the engine's KILL (stop mode kill, after its grace) and `train cancel` of a program
    # that outlives the TERM (Slurm's KILL after KillWait): neither task can remove its
    # folder on the node, and no later chunk runs there
    job_tmp = tmp_path / "job-tmp"
    job_tmp.mkdir()
    env = {**slurm_env, "TMPDIR": str(job_tmp)}
    (tmp_path / "deaf.py").write_text(DEAF)
    started = tmp_path / "started"
    run_dir = submit(tmp_path, env, end, ["--entry", "command", "--nodes", "2", "--launch",
                                          "tasks", "--time", "5", "--max-chunks", "1",
                                          "--stop-mode", "kill", "--save-path", "out"],
                     [sys.executable, "deaf.py", str(started)])
    st = wait(tmp_path, env, end, lambda s: started.exists(), timeout=300)
    assert list(job_tmp.iterdir()), "the tasks' folders while they run"
    if end == "kill":
        walltime_signal(st["chunks"][0]["job_id"], env)
    else:
        assert run_cli(["cancel", end], cwd=tmp_path, env=env).returncode == 0
    st = _ended(tmp_path, env, end)
    assert st["state"] == ("incomplete" if end == "kill" else "cancelled"), (
        st, logs(run_dir)[-3000:])
    left = sorted(p.name for p in job_tmp.iterdir())
    assert left == [], (left, logs(run_dir)[-3000:])
