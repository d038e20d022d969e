"""A check's finding: the field (flag) at fault and what to do, said once for a sweep's
seeds that share it."""

from __future__ import annotations

from dataclasses import dataclass

NO_CHECK = ("if the compute nodes see files or programs that this login node does not, "
            "submit with --no-check")


@dataclass(frozen=True)
class Problem:
    """What would fail the job on the nodes: the field (flag) at fault, what and the fix."""

    field: str
    text: str
    files: bool = True  # about files or programs: --no-check skips it
    # a sweep's chain: its seed, the text saying {seeds} where problems of the same text
    # for several seeds are said once
    seed: int | None = None


def merge_seeds(found: list[Problem]) -> list[Problem]:
    """A sweep's problems said once for all the seeds that have the same one."""
    merged: dict[tuple[str, str, bool], list[int]] = {}
    out: list[Problem] = []
    for p in found:
        if p.seed is None:
            out.append(p)
            continue
        key = (p.field, p.text, p.files)
        if key not in merged:
            merged[key] = []
            out.append(p)
        merged[key].append(p.seed)
    result = []
    for p in out:
        if p.seed is None:
            result.append(p)
            continue
        seeds = merged[(p.field, p.text, p.files)]
        said = f"the folder of seed {seeds[0]}" if len(seeds) == 1 else \
            "the folders of seeds " + ", ".join(map(str, seeds[:-1])) + f" and {seeds[-1]}"
        text = p.text.replace("{seeds}", said).replace(
            "{holds}", "holds" if len(seeds) == 1 else "hold")
        result.append(Problem(p.field, text, p.files))
    return result
