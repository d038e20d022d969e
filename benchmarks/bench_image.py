"""CI image figures: cold build and warm rebuild of the base image through the translator
and a real Docker engine, image size, and container start-up overhead (`train --version`
inside the container against the host). Goals: warm rebuild < 20 s, < 0.3 s added."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine, median, write_section

REPO = Path(__file__).resolve().parents[1]
BASE, TAG = "train-ci-base:bookworm", "train/base:bench"
ARGS = ["--build-arg", f"BASE_IMAGE={BASE}", "--build-arg", "BASE_LOCK=base-cpu.txt"]


def timed_run(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


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
                        str(REPO / "containers" / "wheelhouse"), "-r",
                        str(REPO / "containers" / "requirements" / "base-cpu.txt")],
                       check=True, capture_output=True)
        build = [sys.executable, "-m", "train", "image", "build", "base", "--engine",
                 "docker", "--tag", TAG, *ARGS]
        cold = timed_run(build, env)
        warm = median([timed_run(build, env) for _ in range(3)])
        size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", TAG],
                              env=env, check=True, capture_output=True, text=True).stdout
        inside = [timed_run(["docker", "run", "--rm", "--network", "none", TAG, "--version"],
                            env) for _ in range(7)]
        host = [timed_run([sys.executable, "-m", "train", "--version"], env)
                for _ in range(7)]
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
        f"| image size | {int(size) / 1e9:.2f} GB |",
        f"| `train --version` in the container | {median(inside):.2f} s |",
        f"| `train --version` on the host | {median(host):.2f} s |",
        f"| added by the container | {median(inside) - median(host):.2f} s |",
    ])
    write_section("image", body)


if __name__ == "__main__":
    main()
