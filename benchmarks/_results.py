"""Shared helpers: timing and rewriting one benchmark's section of RESULTS.md.

The short mode (TRAIN_BENCH_SHORT=1, CI's: tests/integration/test_benchmarks.py) runs each
benchmark's code whole on a few rounds of its smallest case, and writes its section to
the file TRAIN_BENCH_RESULTS names instead (its figures are no measurement), where the
slurm tier's cluster (SLURM_CONF) and the docker tier's engine (DOCKER_HOST) are taken
as they are.
"""

from __future__ import annotations

import compileall
import contextlib
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = "# Benchmark results\n\nEach section is rewritten by its script (`nox -s bench`).\n"
SHORT_VAR = "TRAIN_BENCH_SHORT"
RESULTS_VAR = "TRAIN_BENCH_RESULTS"


def short() -> bool:
    """CI's short mode: the benchmark's code whole, its work cut to a few rounds."""
    return os.environ.get(SHORT_VAR) == "1"


def results_file() -> Path:
    """RESULTS.md, or in the short mode the file RESULTS_VAR names (never RESULTS.md)."""
    if not short():
        return RESULTS
    named = os.environ.get(RESULTS_VAR)
    if not named:
        raise SystemExit(f"{SHORT_VAR}=1 needs {RESULTS_VAR}=FILE: a short run's figures "
                         "are no measurement and never go to RESULTS.md")
    return Path(named)


def machine() -> str:
    cpus = len(os.sched_getaffinity(0))
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.machine()}, {cpus} CPUs, {gpu}, torch {torch.__version__}, "
            f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def write_section(name: str, body: str) -> None:
    results = results_file()
    text = results.read_text() if results.exists() else HEADER
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else \
        text.rstrip() + "\n\n" + block + "\n"
    results.write_text(text)
    print(body)


@contextlib.contextmanager
def local_slurm(prefix: str = "tb") -> Iterator[tuple[dict[str, str], Path]]:
    """A local SLURM cluster (ci/slurm-up.sh; root, slurm-wlm, munge) for one benchmark:
    yields the environment to run jobs with and the cluster's directory, then stops it by
    PID (ci/slurm-down.sh). In the short mode, the cluster SLURM_CONF names, as it is.
    The train package's bytecode is written first, as an installed package has it (pip
    compiles at install): both sides import it, and under PYTHONDONTWRITEBYTECODE=1 (set in
    some shells) every start would otherwise compile it from source again, ours 3-4 times
    a job (the client, train launch, the program) to the hand-written job's once."""
    import train

    compileall.compile_dir(str(Path(train.__file__).parent), quiet=1)
    if short() and os.environ.get("SLURM_CONF"):
        yield ({**os.environ, "OMP_NUM_THREADS": "1"},
               Path(os.environ["SLURM_CONF"]).parent)
        return
    repo = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # munge socket < 108 bytes
    up = subprocess.run(["bash", str(repo / "ci" / "slurm-up.sh"), str(folder)],
                        capture_output=True, text=True, check=True)
    env = {**os.environ, "SLURM_CONF": up.stdout.strip().splitlines()[-1],
           "OMP_NUM_THREADS": "1"}
    try:
        yield env, folder
    finally:
        subprocess.run(["bash", str(repo / "ci" / "slurm-down.sh"), str(folder)],
                       check=False)


def idle(env: dict[str, str], bound: float = 300.0) -> None:
    """Wait until the cluster runs and queues no job. Each side's job starts on an idle
    cluster: a job queued while the other side's is still running starts when that one
    ends (Slurm schedules at a job's end), one queued after it at the next scheduling
    pass (up to bf_interval later), so back-to-back submissions would favour the side
    whose job ends sooner or whose client is quicker by more than their own work."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "--noheader", "--format=%i"], env=env,
                             capture_output=True, text=True, check=False)
        if out.returncode == 0 and not out.stdout.strip():
            return
        time.sleep(0.1)
    raise TimeoutError(f"the cluster still had jobs after {bound:g} s")
