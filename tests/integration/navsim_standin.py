"""A stand-in for NAVSIM's run_training.py and run_dataset_caching.py (the test copies it
under both names), honouring the same Hydra-style overrides with NAVSIM's defaults at the
pinned commit: force_cache_computation (true), use_cache_without_dataset (false), cache_path.
Its folder holds scenes.txt (one LOG/TOKEN a line); "computing" a scene's features writes
CACHE/LOG/TOKEN/features.txt and appends `compute LOG/TOKEN` to events.log there. Like
NAVSIM, it takes a scene whose file exists as cached; the training reads every file and
fails on a cut one (as unpickling a cut gzip file does).

Files in its folder steer it: `hold-cache` (the caching script writes half the scenes and a
cut file, then waits to be killed), `hold-train` (the training waits for the walltime
signal USR1, then exits 0 like Lightning after its checkpoint), `wait-peer` (the caching
script starts once the job's log says another task waits for the cache: a test of two
nodes then sees the wait whatever the machine's load)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def event(line: str) -> None:
    with open(HERE / "events.log", "a") as f:
        f.write(line + "\n")


def content(scene: str) -> str:
    return f"features of {scene}\nend\n"


def peer_waits() -> None:
    """Until the job's log says another task waits for the cache (at most 120 s, a bound
    against a hang: what is counted is the log's line)."""
    show = subprocess.run(["scontrol", "show", "job", os.environ["SLURM_JOB_ID"]],
                          capture_output=True, text=True, check=False).stdout
    logs = [Path(p) for p in re.findall(r"Std(?:Out|Err)=(\S+)", show)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(p.is_file() and "waiting for the first task" in p.read_text(errors="replace")
               for p in logs):
            return
        time.sleep(0.2)


def main() -> int:
    args = dict(a.lstrip("+").split("=", 1) for a in sys.argv[1:] if "=" in a)
    force = args.get("force_cache_computation", "true") == "true"
    without = args.get("use_cache_without_dataset", "false") == "true"
    cache = Path(args.get("cache_path") or os.environ.get("NAVSIM_EXP_ROOT", str(HERE))
                 + "/training_cache")
    scenes = (HERE / "scenes.txt").read_text().split()

    def compute(scene: str) -> None:
        (cache / scene).mkdir(parents=True, exist_ok=True)
        (cache / scene / "features.txt").write_text(content(scene))
        event(f"compute {scene}")

    def missing() -> list[str]:
        return scenes if force else [s for s in scenes
                                     if not (cache / s / "features.txt").is_file()]

    if Path(sys.argv[0]).name == "run_dataset_caching.py":
        if (HERE / "wait-peer").exists():
            peer_waits()
        todo = missing()
        for i, scene in enumerate(todo):
            if i == len(todo) // 2 and (HERE / "hold-cache").exists():
                (cache / scene).mkdir(parents=True, exist_ok=True)
                (cache / scene / "features.txt").write_text(content(scene)[:5])  # cut
                event(f"hold-cache {scene}")
                while True:
                    time.sleep(0.2)
            compute(scene)
        return 0
    if without:
        assert not force, "force_cache_computation must be False with the cache alone"
        loaded = sorted(f"{log.name}/{s.name}" for log in cache.iterdir() for s in log.iterdir()
                        if (s / "features.txt").is_file())
    else:
        for scene in missing():
            compute(scene)
        loaded = scenes
    for scene in loaded:
        if (cache / scene / "features.txt").read_text() != content(scene):
            print(f"corrupt cache file for {scene}", file=sys.stderr)
            return 1
    event(f"train {len(loaded)}")
    if (HERE / "hold-train").exists():
        signal.signal(signal.SIGUSR1, lambda s, f: sys.exit(0))
        ready = os.environ.get("TRAIN_SIGNAL_READY")
        if ready:
            Path(ready).touch()
        event("hold-train")
        while True:
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
