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
from _results import machine, median, write_section

REPO = Path(__file__).resolve().parents[1]
BASE, TAG, SC2_TAG = "train-ci-base:bookworm", "train/base:bench", "train/sc2:bench"
EPISODES = 30  # per run; both workloads at res 16 with 10 agent steps per episode
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


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="dkb", dir="/tmp"))
    up = subprocess.run(["bash", str(REPO / "ci" / "docker-up.sh"), str(folder)],
                        capture_output=True, text=True, check=True)
    env = {**os.environ, "DOCKER_HOST": up.stdout.strip().splitlines()[-1]}
    try:
        subprocess.run(["bash", str(REPO / "ci" / "base-rootfs.sh"), BASE], env=env,
                       check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--require-hashes", "-d",
                        str(REPO / ".nox" / "wheelhouse"), "-r",
                        str(REPO / "containers" / "requirements" / "base-cpu.txt")],
                       check=True, capture_output=True)
        build = [sys.executable, "-m", "train", "image", "build", "base", "--engine",
                 "docker", "--tag", TAG, *ARGS]
        cold = timed_run(build, env)
        warm = median([timed_run(build, env) for _ in range(3)])
        size = image_size(TAG, env)
        inside = [timed_run(["docker", "run", "--rm", "--network", "none", TAG, "--version"],
                            env) for _ in range(7)]
        host = [timed_run([sys.executable, "-m", "train", "--version"], env)
                for _ in range(7)]
        sc2_args = subprocess.run([sys.executable, str(REPO / "ci" / "sc2_standins.py"), TAG],
                                  check=True, capture_output=True, text=True).stdout.split("\n")
        sc2_build = [sys.executable, "-m", "train", "image", "build", "sc2", "--engine",
                     "docker", "--tag", SC2_TAG, *[a for a in sc2_args if a]]
        sc2_cold = timed_run(sc2_build, env)
        sc2_warm = median([timed_run(sc2_build, env) for _ in range(3)])
        sc2_size = image_size(SC2_TAG, env)
        sc2_inside = [timed_run(["docker", "run", "--rm", "--network", "none", SC2_TAG,
                                 "--version"], env) for _ in range(7)]
        demo_eps = [episodes_per_second(SC2_TAG, ["run", "demo", "--episode-steps", "10",
                                                  "--out", "/tmp/d", *RUN_ARGS], env)
                    for _ in range(3)]
        mock_eps = [episodes_per_second(SC2_TAG, ["run", "sc2", "--sc2-env", "mock",
                                                  "--out", "/tmp/m", *RUN_ARGS], env)
                    for _ in range(3)]
    finally:
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
        f"| cold build (empty engine, base present) | {cold:.1f} s |",
        f"| warm rebuild (nothing changed, median of 3) | {warm:.1f} s |",
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
        f"| cold build (base present) | {sc2_cold:.1f} s |",
        f"| warm rebuild (median of 3) | {sc2_warm:.1f} s |",
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
