"""`train doctor` on real failing jobs of the local Slurm cluster (see conftest.py): a user's
program that fails as jobs fail in the field (tests/integration/failing.py), submitted as a
command job, all at once. The doctor must name the cause, quote the log line, and give the
fix. (Walltime, scancel, SIGKILL, node failure and train's own errors: test_slurm.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.integration.chains import TERMINAL, wait

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("failing.py")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (the test machines run as root, as CI does)."""
    folder = tmp_path / "small"
    folder.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _submit(cwd: Path, env: dict[str, str], name: str, *args: str) -> None:
    run_dir = cwd / "runs" / name
    run_dir.mkdir(parents=True)
    script = run_dir / "failing.py"
    shutil.copy(SCRIPT, script)
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--entry", "command",
                    "--python", sys.executable, "--cpus-per-task", "1", "--mem", "1000M",
                    "--time", "5", "--max-chunks", "1", "--", sys.executable, str(script),
                    *args], cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr


def _doctor(cwd: Path, env: dict[str, str], name: str) -> dict[str, Any]:
    proc = run_cli(["doctor", name, "--json"], cwd=cwd, env=env)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_the_doctor_names_each_real_failure(tmp_path: Path, slurm_env: dict[str, str],
                                            small_disk: Path) -> None:
    jobs = {"rdv": ("rendezvous",), "pyerr": ("python_error",),
            "disk": ("disk", str(small_disk)), "mem": ("memory",)}
    for name, args in jobs.items():
        _submit(tmp_path, slurm_env, name, *args)
    reports = {}
    for name in jobs:
        st = wait(tmp_path, slurm_env, name, lambda s: s["state"] in TERMINAL)
        assert st["state"] == "failed", st
        reports[name] = _doctor(tmp_path, slurm_env, name)
    first = {name: r["findings"][0] for name, r in reports.items()}
    assert first["rdv"]["cause"] == "rendezvous", first["rdv"]
    assert first["rdv"]["detail"] == "1 of 2 ranks joined" and "srun" in first["rdv"]["fix"]
    assert first["pyerr"]["cause"] == "python_error"
    assert first["pyerr"]["detail"] == "KeyError: 'lr'"
    assert first["disk"]["cause"] == "disk_full" and "scratch" in first["disk"]["fix"]
    assert first["mem"]["cause"] == "host_oom" and "--mem" in first["mem"]["fix"]
    for name, f in first.items():
        ev = f["evidence"][0]
        assert ev["file"].endswith(".err") and ev["line"] > 0, (name, f)
        lines = Path(ev["file"]).read_text(errors="replace").splitlines()
        assert lines[ev["line"] - 1].strip().startswith(ev["text"][:80]), (name, ev)
    # the human form says the same, with the fix
    proc = run_cli(["doctor", "pyerr"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 1
    assert "cause: chunk 1" in proc.stdout and "fix: " in proc.stdout
    # and every run in one table, with the doctor's verdict
    proc = run_cli(["status", "--all", "--json"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert {n: r["verdict"].split()[0] for n, r in rows.items()} == {
        "rdv": "rendezvous", "pyerr": "python_error", "disk": "disk_full", "mem": "host_oom"}
    proc = run_cli(["status", "--all"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0 and proc.stdout.splitlines()[0].startswith("NAME")
