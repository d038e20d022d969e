"""A value sweep as its user meets it after submission: `train cancel` of a sweep one of
whose task folders cannot be read (removed, or its chain.json cut short) still cancels the
tasks it can read and the unreadable task's array task; `train doctor` and `train logs`
of the sweep itself name its real task folders. Stand-ins for Slurm's commands (a unit
test: no cluster)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.conftest import run_cli

SLURM = {
    "sbatch": "#!/bin/bash\necho 7001\n",
    "scontrol": "#!/bin/bash\nexit 0\n",
    # the array's two tasks are waiting for the throttle
    "squeue": '#!/bin/bash\ncase "$*" in *--array*) printf "7001_0|PENDING|None\\n'
              '7001_1|PENDING|None\\n";; esac\n',
    "sacct": "#!/bin/bash\nexit 0\n",
    "scancel": '#!/bin/bash\necho "$@" >> "$SCANCELLED"\n',
}


def _submitted(tmp_path: Path) -> dict[str, str]:
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    for name, text in SLURM.items():
        (sbin / name).write_text(text)
        (sbin / name).chmod(0o755)
    env = {"PATH": f"{sbin}:{os.environ['PATH']}",
           "SCANCELLED": str(tmp_path / "scancelled")}
    proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", "sw",
                    "--entry", "command", "--runtime", "none", "--python", sys.executable,
                    "--sweep", "x=1,2", "--sweep-throttle", "1", "--", "true"],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    return env


def test_a_damaged_sweep_is_still_cancelled(tmp_path: Path) -> None:
    env = _submitted(tmp_path)
    (tmp_path / "runs" / "sw" / "task-1" / "chain.json").write_text("{")  # cut short
    proc = run_cli(["cancel", "sw"], cwd=tmp_path, env=env)
    cancelled = (tmp_path / "scancelled").read_text().split()
    assert sorted(cancelled) == ["7001_0", "7001_1"], (proc.stdout, proc.stderr)
    assert "task 1" in proc.stderr and "chain.json" in proc.stderr, proc.stderr
    assert proc.returncode == 2  # cancelled, but the folder is damaged: said, not hidden


def test_doctor_and_logs_of_a_value_sweep_name_its_task_folders(tmp_path: Path) -> None:
    env = _submitted(tmp_path)
    for command in ("doctor", "logs"):
        proc = run_cli([command, "sw"], cwd=tmp_path, env=env)
        assert proc.returncode == 2, proc.stderr
        assert "sw/task-0, sw/task-1" in proc.stderr and "seed" not in proc.stderr, \
            proc.stderr


def test_summary_of_a_commands_sweep_names_a_damaged_entry_and_sums_up_the_rest(
        tmp_path: Path) -> None:
    import json

    env = _submitted(tmp_path)
    record = tmp_path / "runs" / "sw" / "sweep.json"
    data = json.loads(record.read_text())
    data["chains"][0]["index"] = "zero"
    record.write_text(json.dumps(data))
    proc = run_cli(["summary", "sw"], cwd=tmp_path, env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "chain 1: its index 'zero' is not a whole number" in proc.stderr, proc.stderr
    assert "sweep of 1 values of --x" in proc.stdout, proc.stdout
