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
    seeds: dict[tuple[str, str, bool], list[int]] = {}
    for p in found:
        if p.seed is not None:
            seeds.setdefault((p.field, p.text, p.files), []).append(p.seed)
    result = []
    for p in found:
        if p.seed is None:
            result.append(p)
            continue
        same = seeds.pop((p.field, p.text, p.files), None)
        if same is None:  # (said already, with the first seed of its text)
            continue
        said = f"the folder of seed {same[0]}" if len(same) == 1 else \
            "the folders of seeds " + ", ".join(map(str, same[:-1])) + f" and {same[-1]}"
        text = p.text.replace("{seeds}", said).replace(
            "{holds}", "holds" if len(same) == 1 else "hold")
        result.append(Problem(p.field, text, p.files))
    return result
