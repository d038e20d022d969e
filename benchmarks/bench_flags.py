"""What the field notes' jobs take to write: the flags of `train submit` (with the defaults
`train init` writes: cluster, account, image), next to the `#SBATCH` lines and the srun
line a hand-written script needs for the same job (counted in the script `train render`
prints, which is what one would otherwise write by hand), and the `rv` one-liners of the
Rivanna guides where they have one. Every command is rendered for real (exit 0 required).
Then `train render` start-up, cold (no bytecode cache) and warm, against the interpreter
importing PyYAML alone (the hand-written baseline of a client).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine, short, write_section

REPO = Path(__file__).resolve().parents[1]

# (job, defaults, flags, workload, rv one-liner or None)
JOBS = [
    ("Gilbreth E1, 2 h standby chunks to 9000 episodes",
     {"cluster": "gilbreth", "account": "lab", "image": "/scratch/gilbreth/me/base.sif"},
     ["-p", "a30", "-q", "standby", "-t", "2:00:00", "-g", "1", "-J", "e1"],
     ["demo", "--res", "32", "--episodes", "9000"], None),
    ("NAVSIM 4 nodes x 4 L40S on Torch, 1 day",
     {"cluster": "torch", "account": "torch_pr_1_general", "runtime": "apptainer",
      "image": "/scratch/me/navsim.sif"},
     ["-C", "l40s", "-N", "4", "-g", "4", "-c", "8", "--mem", "200G", "--workers", "2",
      "-e", "navsim", "-t", "1-00:00:00", "--data", "DATA"],
     ["agent=hydra_mdp_v8192_w_ep"], None),
    ("Rivanna 2-node A100 DDP of your own script",
     {"cluster": "rivanna", "account": "grp", "runtime": "apptainer",
      "image": "/scratch/grp/base.sif"},
     ["-N", "2", "-g", "8", "--gpu-type", "a100", "-e", "command", "-t", "12:00:00"],
     ["python", "train.py"], "rv run -g 8 -t a100 -- torchrun --nproc_per_node=8 train.py "
     "(one node only)"),
    ("MIG smoke test on Rivanna, 10 minutes",
     {"cluster": "rivanna", "account": "grp", "image": "/scratch/grp/base.sif"},
     ["-p", "gpu-mig", "-g", "1", "-e", "command", "-t", "10"],
     ["python", "train.py"], "rv run --mig --time 10m -- python train.py"),
]


def _flags(argv: list[str]) -> int:
    return sum(1 for a in argv if a.startswith("-"))


def _render(defaults: dict[str, object], flags: list[str], workload: list[str],
            work: Path) -> str:
    import yaml

    path = work / "defaults.yaml"
    path.write_text(yaml.safe_dump(defaults))
    flags = [str(work) if f == "DATA" else f for f in flags]
    proc = subprocess.run([sys.executable, "-m", "train", "render", *flags, "--", *workload],
                          capture_output=True, text=True, cwd=work, check=False,
                          env={**os.environ, "TRAIN_DEFAULTS": str(path)})
    if proc.returncode != 0:
        raise SystemExit(f"render failed: {' '.join(flags)}: {proc.stderr}")
    return proc.stdout


def _startup(argv: list[str], env: dict[str, str], cwd: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, cwd=cwd, env=env, check=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    rows = ["| job | `train submit` flags (with defaults) | hand-written: `#SBATCH` lines "
            "+ srun options | rv one-liner |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for job, defaults, flags, workload, rv in JOBS:
            script = _render(defaults, flags, workload, work)
            sbatch = sum(1 for line in script.splitlines() if line.startswith("#SBATCH"))
            # the srun options: from srun to the engine's task wrapper
            command = script[script.rindex("\nexec "):].replace("\\\n", " ").split()
            srun = command[command.index("srun"):command.index("task")]
            srun_opts = sum(1 for a in srun if a.startswith("--"))
            shown = " ".join(flags).replace("DATA", "DIR")
            rows.append(f"| {job} | {_flags(flags)}: `{shown}` | {sbatch} + {srun_opts} "
                        f"(and the container, rendezvous and signal code) | "
                        f"{rv or 'none'} |")
        # start-up: a copy of the package without bytecode is "cold" on its first run
        src = work / "src"
        shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
        env = {**os.environ, "PYTHONPATH": str(src), "TRAIN_DEFAULTS": str(work / "none")}
        argv = [sys.executable, "-m", "train", "render", "--cluster", "local", "--python",
                sys.executable, "--", "demo"]
        runs = 1 if short() else 7
        cold = _startup(argv, env, work, 1)[0]
        warm = statistics.median(_startup(argv, env, work, runs))
        base = statistics.median(_startup([sys.executable, "-c", "import yaml"], env, work,
                                          runs))
    body = "\n".join([
        "## Flags per job, and `train render` start-up (`bench_flags.py`)", "",
        f"Machine: {machine()}", "",
        *rows, "",
        "The `rv` tool runs one node; the sbatch counts are the lines `train render` wrote "
        "for the same job (what a hand-written script must get right), not counting the "
        "rendezvous, container and walltime-signal code around the step.", "",
        f"`train render` start-up: cold (no bytecode) {cold * 1000:.0f} ms, warm "
        f"{warm * 1000:.0f} ms (median of {runs}); the interpreter importing PyYAML alone "
        f"{base * 1000:.0f} ms: ratio warm/baseline {warm / base:.2f}. The login-node "
        "client venv measures 31 MB (tests/integration/test_client_install.py; the goal is "
        "< 50 MB)."])
    write_section("flags", body)


if __name__ == "__main__":
    main()
