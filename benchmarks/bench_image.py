"""CI image figures: cold build and warm rebuild of the base image and of the sc2 image (with
CI's stand-ins for the game and the maps) through the translator and a real Docker engine,
image sizes, container start-up overhead (`train --version` inside the container against
the host), and `train run sc2` on pysc2's mock environment against the demo at the same
resolution and episode length, both inside the sc2 image. Goals: warm rebuild < 20 s,
< 0.3 s added."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine, median, short, write_section

REPO = Path(__file__).resolve().parents[1]
BASE, TAG, SC2_TAG = "train-ci-base:bookworm", "train/base:bench", "train/sc2:bench"
EPISODES = 3 if short() else 30  # per run; both at res 16, 10 agent steps per episode
RUNS = 1 if short() else 7  # start-ups timed
# the short mode builds nothing: it takes the images the docker tier built, in the engine
# DOCKER_HOST names (tests/integration/test_benchmarks.py)
SHORT_TAGS = ("TRAIN_BENCH_BASE_TAG", "TRAIN_BENCH_SC2_TAG")
RUN_ARGS = ["--device", "cpu", "--res", "16", "--batch-size", "8", "--learning-starts", "8",
            "--replay-size", "500", "--episodes", str(EPISODES), "--eval-episodes", "0",
            "--log-every", "1"]
ARGS = ["--build-arg", f"BASE_IMAGE={BASE}", "--build-arg", "BASE_LOCK=base-cpu.txt",
        "--build-arg", "WHEELHOUSE=.nox/wheelhouse"]


def timed_run(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def image_size(tag: str, env: dict[str, str]) -> int:
    out = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", tag], env=env,
                         check=True, capture_output=True, text=True).stdout
    return int(out)


def episodes_per_second(tag: str, args: list[str], env: dict[str, str]) -> float:
    """The trainer's own rate on its last progress line (training only, no start-up)."""
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, *args], env=env,
                          check=True, capture_output=True, text=True)
    rates = re.findall(r"\(([0-9.]+) ep/s\)", proc.stdout + proc.stderr)
    if not rates:
        raise SystemExit(f"no progress line in the output of {args}")
    return float(rates[-1])


def builds(env: dict[str, str]) -> tuple[str, str, list[float], list[float]]:
    """Builds base and sc2, each cold then warm 3 times: (base tag, sc2 tag, [base cold,
    warm], [sc2 cold, warm]); the short mode's images as they are, nothing built."""
    if short():
        base_tag, sc2_tag = (os.environ[name] for name in SHORT_TAGS)
        return base_tag, sc2_tag, [], []
    subprocess.run(["bash", str(REPO / "ci" / "base-rootfs.sh"), BASE], env=env,
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--require-hashes", "-d", str(REPO / ".nox" / "wheelhouse"), "-r",
                    str(REPO / "containers" / "requirements" / "base-cpu.txt")],
                   check=True, capture_output=True)
    build = [sys.executable, "-m", "train", "image", "build", "base", "--engine", "docker",
             "--tag", TAG, *ARGS]
    base_times = [timed_run(build, env), median([timed_run(build, env) for _ in range(3)])]
    sc2_args = subprocess.run([sys.executable, str(REPO / "ci" / "sc2_standins.py"), TAG],
                              check=True, capture_output=True, text=True).stdout.split("\n")
    sc2_build = [sys.executable, "-m", "train", "image", "build", "sc2", "--engine",
                 "docker", "--tag", SC2_TAG, *[a for a in sc2_args if a]]
    sc2_times = [timed_run(sc2_build, env),
                 median([timed_run(sc2_build, env) for _ in range(3)])]
    return TAG, SC2_TAG, base_times, sc2_times


def _build_rows(times: list[float], cold: str, warm: str) -> list[str]:
    if not times:
        return [f"| {cold} | not built in the short mode |"]
    return [f"| {cold} | {times[0]:.1f} s |", f"| {warm} | {times[1]:.1f} s |"]


def main() -> None:
    folder = None if short() else Path(tempfile.mkdtemp(prefix="dkb", dir="/tmp"))
    env = dict(os.environ)
    try:
        if folder is not None:
            up = subprocess.run(["bash", str(REPO / "ci" / "docker-up.sh"), str(folder)],
                                capture_output=True, text=True, check=True)
            env["DOCKER_HOST"] = up.stdout.strip().splitlines()[-1]
        tag, sc2_tag, base_times, sc2_times = builds(env)
        size = image_size(tag, env)
        inside = [timed_run(["docker", "run", "--rm", "--network", "none", tag, "--version"],
                            env) for _ in range(RUNS)]
        host = [timed_run([sys.executable, "-m", "train", "--version"], env)
                for _ in range(RUNS)]
        sc2_size = image_size(sc2_tag, env)
        sc2_inside = [timed_run(["docker", "run", "--rm", "--network", "none", sc2_tag,
                                 "--version"], env) for _ in range(RUNS)]
        rates = 1 if short() else 3
        demo_eps = [episodes_per_second(sc2_tag, ["run", "demo", "--episode-steps", "10",
                                                  "--out", "/tmp/d", *RUN_ARGS], env)
                    for _ in range(rates)]
        mock_eps = [episodes_per_second(sc2_tag, ["run", "sc2", "--sc2-env", "mock",
                                                  "--out", "/tmp/m", *RUN_ARGS], env)
                    for _ in range(rates)]
    finally:
        if folder is not None:
            subprocess.run(["bash", str(REPO / "ci" / "docker-down.sh"), str(folder)],
                           check=False)
            subprocess.run(["rm", "-rf", str(folder)], check=False)
    body = "\n".join([
        "## CI image build, size and container start-up (goals: warm rebuild < 20 s, "
        "< 0.3 s added)",
        "",
        f"Machine: {machine()}. Docker 20.10 (Debian docker.io), base.def translated to a "
        "Dockerfile, debootstrapped bookworm base, CPU torch from the offline wheelhouse, "
        "`--network none`. Start-up: median of 7 `docker run --rm IMAGE --version` "
        "(the runscript: python -m train --version) against the same command on the host.",
        "",
        "| figure | value |",
        "|---|---|",
        *_build_rows(base_times, "cold build (empty engine, base present)",
                     "warm rebuild (nothing changed, median of 3)"),
        f"| image size | {size / 1e9:.2f} GB |",
        f"| `train --version` in the container | {median(inside):.2f} s |",
        f"| `train --version` on the host | {median(host):.2f} s |",
        f"| added by the container | {median(inside) - median(host):.2f} s |",
        "",
        "sc2 image (on the base above; CI's stand-ins for the game and the maps, the sc2 "
        "lock's wheels offline):",
        "",
        "| figure | value |",
        "|---|---|",
        *_build_rows(sc2_times, "cold build (base present)", "warm rebuild (median of 3)"),
        f"| image size (base included) | {sc2_size / 1e9:.2f} GB |",
        f"| `train --version` in the container | {median(sc2_inside):.2f} s |",
        f"| demo, res 16, 10 steps per episode (median of 3 runs of {EPISODES}) | "
        f"{median(demo_eps):.2f} episodes/s |",
        f"| sc2 on pysc2's mock environment, same settings | {median(mock_eps):.2f} "
        "episodes/s |",
        f"| mock / demo | {median(mock_eps) / median(demo_eps):.2f}x |",
    ])
    write_section("image", body)


if __name__ == "__main__":
    main()
