"""A command's sweep on the REAL local SLURM cluster: each task gets its value and its own
folder where the command says {value} and {task_dir}, `train summary` prints the metrics
each task wrote to TRAIN_METRICS_FILE, and no empty log file of an array task is left
beside the sweep's logs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.chains import settled, wait

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROGRAM = """\
import json, os, sys
lr, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "lr"), "w") as fh:
    fh.write(lr)
with open(os.environ["TRAIN_METRICS_FILE"], "w") as fh:
    json.dump({"loss": float(lr) * 2, "lr_seen": float(lr)}, fh)
"""


def test_a_commands_sweep_puts_each_value_and_folder_in_place_and_sums_up_its_metrics(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    (tmp_path / "fit.py").write_text(PROGRAM)
    proc = run_cli(["submit", "--name", "cs", "--cluster", "local", "-e", "command",
                    "--python", sys.executable, "--cpus-per-task", "1", "--mem", "500M",
                    "--time", "5", "--sweep", "lr=0.1,0.3", "--",
                    sys.executable, "fit.py", "{value}", "{task_dir}/out"],
                   cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    assert "same command" not in proc.stderr and "writes to" not in proc.stderr
    st = wait(tmp_path, slurm_env, "cs", lambda s: all(settled(c) for c in s["chains"]))
    assert st["counts"] == {"complete": 2}, st
    root = tmp_path / "runs" / "cs"
    assert [(root / f"task-{i}" / "out" / "lr").read_text() for i in (0, 1)] == ["0.1", "0.3"]
    out = run_cli(["summary", "cs"], cwd=tmp_path, env=slurm_env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "loss" in lines[1] and "lr_seen" in lines[1], out.stdout
    assert lines[2].split() == ["0.1", "0.2", "0.1", "complete"], out.stdout
    assert lines[3].split() == ["0.3", "0.6", "0.3", "complete"], out.stdout
    empty = [p.name for p in (root / "logs").iterdir() if p.stat().st_size == 0]
    assert empty == [], sorted(p.name for p in (root / "logs").iterdir())


# a program that writes where it runs, as most research code does (pytorch/examples'
# multinode.py: a hard-coded snapshot.pt in the current folder, resumed from when there)
SNAPSHOT_PROGRAM = """\
import json, os, sys
snap, epochs, start = "snapshot.pt", 5, 0
if os.path.exists(snap):
    with open(snap) as fh:
        start = json.load(fh)["epoch"]
    print(f"resumed from {os.path.abspath(snap)} at epoch {start}")
for epoch in range(start, epochs):
    with open(snap + ".tmp", "w") as fh:
        json.dump({"epoch": epoch + 1, "lr": sys.argv[1]}, fh)
    os.replace(snap + ".tmp", snap)
print(f"lr {sys.argv[1]}: ran epochs {start} to {epochs - 1}")
"""


def test_a_sweep_of_a_program_that_writes_where_it_runs_gives_each_task_its_folder(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """Issue 39: the tasks shared the submit folder and resumed from one another's
    snapshot.pt; `--chdir {task_dir}` (refused then) runs each in its own folder."""
    (tmp_path / "snap.py").write_text(SNAPSHOT_PROGRAM)
    proc = run_cli(["submit", "--name", "sn", "--cluster", "local", "-e", "command",
                    "--python", sys.executable, "--cpus-per-task", "1", "--mem", "500M",
                    "--time", "5", "--sweep", "lr=0.1,0.3", "--chdir", "{task_dir}",
                    "--sweep-throttle", "1", "--",
                    sys.executable, str(tmp_path / "snap.py"), "{value}"],
                   cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    assert "all run in" not in proc.stderr, proc.stderr
    st = wait(tmp_path, slurm_env, "sn", lambda s: all(settled(c) for c in s["chains"]))
    assert st["counts"] == {"complete": 2}, st
    root = tmp_path / "runs" / "sn"
    for index, lr in enumerate(("0.1", "0.3")):
        folder = root / f"task-{index}"
        assert json.loads((folder / "snapshot.pt").read_text()) == {"epoch": 5, "lr": lr}
        out = "".join(p.read_text() for p in (folder / "logs").glob("*.out"))
        assert f"lr {lr}: ran epochs 0 to 4" in out and "resumed" not in out, out
    assert not (tmp_path / "snapshot.pt").exists()
