"""A researcher's program in an image of plain python3 (no torch, no `train`): one rank
per task, standard library only. It keeps the README's walltime contract: on its stop
signal (TRAIN_STOP_SIGNAL) each rank saves its step into TRAIN_RUN_DIR and exits 0; it
resumes from there; it exits 0 when the work is done. It prints which Python, which
site-packages and which environment it ran with, so a test can see what the container
brought in.

Test knobs (environment): USER_STEPS total steps; USER_HOLD_AT makes the first chunk wait
there (still answering its stop signal) after writing `user_held-RANK`, so a test stops
it with work left, counted in steps, never in seconds. USER_LATE_RANK: that rank starts
late (a node still unpacking the image): before its handler is set, it writes
`user_late-RANK` and waits for the test's `user_go`. USER_STEP_SECONDS: each step takes
that long (a trainer's step of a known length, so that a shorter chunk does less work; a
step the stop signal comes in is not done). USER_SLOW_EXIT: from its stop signal on a rank has no
handler for it (a one-shot handler; a Python at exit takes its handlers away) and after its
save takes that long to exit (a large program's exit on a busy node).
"""

import importlib.util
import json
import os
import signal
import site
import sys
import time
from pathlib import Path

stop = {"signal": 0}


def on_stop(signum, frame):
    stop["signal"] = signum
    if os.environ.get("USER_SLOW_EXIT"):
        signal.signal(signum, signal.SIG_DFL)


def leaks() -> list[str]:
    """What of the login node's side reached this process: the tests' planted modules
    (POISON_MODULE on a PYTHONPATH, a usercustomize in the user site-packages), and
    variables that change imports or libraries (LD_LIBRARY_PATH: Apptainer's own only)."""
    found = [name for name in ("poisonmod", "usercustomize")
             if name in sys.modules or importlib.util.find_spec(name) is not None]
    found += [name for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP",
                                "POISON_MARK") if name in os.environ]
    found += [name for name in os.environ if name.startswith(("APPTAINERENV_",
                                                              "SINGULARITYENV_"))]
    if os.path.isdir("/opt/poison"):  # an APPTAINER_BIND of the submitting shell
        found.append("/opt/poison")
    if os.environ.get("LD_LIBRARY_PATH", "/.singularity.d/libs") != "/.singularity.d/libs":
        found.append("LD_LIBRARY_PATH=" + os.environ["LD_LIBRARY_PATH"])
    return found


def save(ckpt: Path, rank: int, step: int) -> int:
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step}))
    tmp.replace(ckpt)
    print(f"plain rank {rank} stopped by signal at step {step}", flush=True)
    time.sleep(float(os.environ.get("USER_SLOW_EXIT", "0")))
    return 0


def main() -> int:
    run_dir = Path(os.environ.get("TRAIN_RUN_DIR", "."))
    rank = int(os.environ.get("RANK", "0"))
    if os.environ.get("USER_LATE_RANK") == str(rank) and os.environ.get("TRAIN_CHUNK") == "1":
        (run_dir / f"user_late-{rank}").write_text("waiting")
        while not (run_dir / "user_go").exists():
            time.sleep(0.1)
    wanted = os.environ.get("TRAIN_STOP_SIGNAL", "USR1")
    if wanted != "none":
        signal.signal(getattr(signal, "SIG" + wanted), on_stop)
    ready = os.environ.get("TRAIN_SIGNAL_READY")
    if ready:  # the handler is in place: the walltime signal may come now
        Path(ready).touch()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    print(f"plain rank {rank}/{world} python {sys.executable} {sys.version.split()[0]}",
          flush=True)
    print(f"plain rank {rank} site-packages {site.getsitepackages()} user-site "
          f"{site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages())}",
          flush=True)
    print(f"plain rank {rank} can import train: "
          f"{importlib.util.find_spec('train') is not None} torch: "
          f"{importlib.util.find_spec('torch') is not None}", flush=True)
    print(f"plain rank {rank} env PYTHONPATH={os.environ.get('PYTHONPATH', '<unset>')} "
          f"VIRTUAL_ENV={os.environ.get('VIRTUAL_ENV', '<unset>')} "
          f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '<unset>')} "
          f"HOME={os.environ.get('HOME', '<unset>')}", flush=True)
    print(f"plain rank {rank} gpus {os.environ.get('SLURM_GPUS_ON_NODE', '<unset>')}",
          flush=True)
    print(f"plain rank {rank} leaks: {leaks()}", flush=True)
    ckpt = run_dir / f"plain_ckpt-{rank}.json"
    step = 0
    if ckpt.exists():
        step = json.loads(ckpt.read_text())["step"]
        print(f"plain rank {rank} resumed at step {step}", flush=True)
    total = int(os.environ.get("USER_STEPS", "20"))
    hold = int(os.environ.get("USER_HOLD_AT", "0"))
    first_chunk = os.environ.get("TRAIN_CHUNK", "1") == "1"
    pace = float(os.environ.get("USER_STEP_SECONDS", "0"))
    while step < total:
        until = time.monotonic() + pace
        while time.monotonic() < until and not stop["signal"]:
            time.sleep(0.05)
        if stop["signal"]:
            return save(ckpt, rank, step)
        step += 1
        while hold and first_chunk and step == hold and not stop["signal"]:
            held = run_dir / f"user_held-{rank}"
            if not held.exists():
                held.write_text(str(step))
            time.sleep(0.1)
        if stop["signal"]:
            return save(ckpt, rank, step)
    print(f"plain rank {rank} done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
