"""Time from `train submit` to the first training step on the local SLURM cluster, against a
hand-written minimal job (`sbatch --wrap "srun python -m train run ..."`) that does the same
import and step, alternating in the same run. Goal: ratio <= 1.15.

Starts its own cluster with ci/slurm-up.sh (root, slurm-wlm, munge) and stops it after."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import idle, local_slurm, machine, median, short, write_section

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = ["demo", "--device", "cpu", "--res", "8", "--episode-steps", "16",
            "--batch-size", "8", "--learning-starts", "8", "--replay-size", "400",
            "--episodes", "2", "--eval-episodes", "0"]
STAMP = re.compile(r"first training step done at unix time ([\d.]+)")


def first_step(log_dir: Path, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in (p for p in log_dir.glob("*") if p.is_file()):
            match = STAMP.search(path.read_text(errors="replace"))
            if match:
                return float(match.group(1))
        time.sleep(0.05)
    raise TimeoutError(f"no first training step logged under {log_dir}")


def ours(work: Path, env: dict[str, str], i: int) -> float:
    name = f"ours{i}"
    idle(env)
    start = time.time()
    subprocess.run([sys.executable, "-m", "train", "submit", "--name", name, "--cluster",
                    "local", "--python", sys.executable, "--cpus-per-task", "1", "--mem",
                    "1000M", "--time", "5", "--", *WORKLOAD], cwd=work, env=env, check=True,
                   capture_output=True)
    return first_step(work / "runs" / name / "logs") - start


def baseline(work: Path, env: dict[str, str], i: int) -> float:
    out = work / f"base{i}"
    out.mkdir()
    command = shlex.join(["srun", "--cpus-per-task=1", sys.executable, "-m", "train", "run",
                          *WORKLOAD, "--out", str(out / "run")])
    idle(env)
    start = time.time()
    subprocess.run(["sbatch", "--parsable", "--cpus-per-task=1", "--mem=1000M", "--time=5",
                    f"--output={out}/job.out", f"--error={out}/job.err", "--wrap", command],
                   cwd=work, env=env, check=True, capture_output=True)
    return first_step(out) - start


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, local_slurm() as (env, _):
        work = Path(tmp)
        t_ours, t_base = [], []
        for i in range(1 if short() else 6):  # alternating order cancels drift
            if i % 2:
                t_ours.append(ours(work, env, i))
                t_base.append(baseline(work, env, i))
            else:
                t_base.append(baseline(work, env, i))
                t_ours.append(ours(work, env, i))
        idle(env)  # every job has ended before its folder is removed (they write in it)
    o, b = median(t_ours), median(t_base)
    body = "\n".join([
        "## Submit to first training step (goal: <= 1.15x a hand-written job)",
        "",
        f"Machine: {machine()}; the local SLURM cluster of ci/slurm-up.sh (Slurm 22.05, "
        "sched_interval=2). Median of 6 alternating submissions each, each once the cluster "
        "is idle (a job queued while the other side's runs would start at that one's end). "
        "Ours: `train submit` "
        "(validation, rendering, held chain, release, job prologue, srun). Baseline: "
        "`sbatch --wrap \"srun python -m train run ...\"` with the same workload. The "
        "train package's bytecode is compiled first, as an installed package's is.",
        "",
        "| | seconds to first training step (median) | all runs |",
        "|---|---|---|",
        f"| train submit | {o:.2f} | {', '.join(f'{t:.2f}' for t in t_ours)} |",
        f"| hand-written sbatch + srun | {b:.2f} | {', '.join(f'{t:.2f}' for t in t_base)} |",
        f"| ratio | {o / b:.3f} | |",
    ])
    write_section("submit", body)


if __name__ == "__main__":
    main()
