"""Translator golden cases: the Dockerfile and scripts generated from each image definition.
Regenerate after an intended change with `python -m tests.golden.images_cases`."""

from __future__ import annotations

from pathlib import Path

from train.images.defs import containers_dir, parse
from train.images.dockerfile import translate

HERE = Path(__file__).parent / "images"
CASES = {
    "base-ci": ("base", {"BASE_IMAGE": "train-ci-base:bookworm", "BASE_LOCK": "base-cpu.txt"},
                {}),
    "base": ("base", {}, {}),
    "sc2": ("sc2", {}, {"base.sif": "train/base:ci"}),
    "navsim": ("navsim", {}, {"base.sif": "train/base:ci"}),
}


def rendered(case: str) -> str:
    image, args, local = CASES[case]
    t = translate(parse(containers_dir() / f"{image}.def"), args, local)
    parts = [t.dockerfile] + [f"# ===== .train-build/{name} =====\n{text}"
                              for name, text in sorted(t.scripts.items())]
    return "\n".join(parts)


def golden_path(case: str) -> Path:
    return HERE / f"{case}.txt"


if __name__ == "__main__":
    for case in CASES:
        golden_path(case).write_text(rendered(case), encoding="utf-8")
        print(f"wrote {golden_path(case)}")
