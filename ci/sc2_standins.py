"""CI's offline inputs for sc2.def, written to .nox/sc2-standins (a folder no cluster build
looks in: sc2.def copies its DOWNLOADS folder, containers/downloads unless CI's build
argument names this one, to /opt/train/downloads): small stand-ins for the game and the
maps, laid out as the real archives are (StarCraftII/Versions/Base*/SC2_x64,
mini_games/*.SC2Map; zips with fixed timestamps, so the same bytes every time), and the
wheels of the sc2 lock. Prints the `train image build` arguments that point the build at
them, one per line; the real URLs and checksums stay the definition's defaults.

Usage: python ci/sc2_standins.py BASE_TAG   (BASE_TAG: the docker tag of the base image)
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOWNLOADS = REPO / ".nox" / "sc2-standins"
INSIDE = "/opt/train/downloads"  # sc2.def's %files destination for its DOWNLOADS folder
GAME = {"StarCraftII/Versions/Base75689/SC2_x64": (
            b"#!/bin/sh\necho 'CI stand-in for the StarCraft II binary' >&2\nexit 1\n", 0o755),
        "StarCraftII/Maps/.keep": (b"", 0o644)}
MAPS = {"mini_games/MoveToBeacon.SC2Map": (b"CI stand-in map\n", 0o644)}


def write_zip(path: Path, members: dict[str, tuple[bytes, int]]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, (data, mode) in members.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            zf.writestr(info, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    game = write_zip(DOWNLOADS / "SC2.4.10.zip", GAME)
    maps = write_zip(DOWNLOADS / "mini_games.zip", MAPS)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--require-hashes", "-d", str(DOWNLOADS), "-r",
                    str(REPO / "containers" / "requirements" / "sc2.txt")], check=True)
    for arg in ("BASE_SIF=base.sif", f"DOWNLOADS={DOWNLOADS.relative_to(REPO)}",
                f"SC2_URL=file://{INSIDE}/SC2.4.10.zip",
                f"SC2_SHA256={game}", f"MAPS_URL=file://{INSIDE}/mini_games.zip",
                f"MAPS_SHA256={maps}"):
        print("--build-arg")
        print(arg)
    print("--localimage")
    print(f"base.sif={argv[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
