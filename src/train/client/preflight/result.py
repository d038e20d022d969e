"""A preflight check's outcome (Check), the checks' names, and how they are shown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# check names, in the order they run
RUNTIME, IMAGE, ACCOUNT, RUNS_ROOT, CUDA = ("container runtime", "image", "account",
                                            "runs root", "CUDA vs driver")
ARCH = "GPU architecture"


@dataclass(frozen=True)
class Check:
    """One check's outcome. ok: True passed, False failed, None skipped (cannot tell, or
    not applicable). `warn` marks a pass that deserves attention; `fix` says what to do."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""
    warn: bool = False

    @property
    def status(self) -> str:
        if self.ok is None:
            return "skip"
        if not self.ok:
            return "fail"
        return "warn" if self.warn else "pass"


def failed(checks: Sequence[Check]) -> bool:  # the command's exit 1
    return any(c.ok is False for c in checks)


def format_checks(checks: Sequence[Check]) -> list[str]:
    lines = []
    for c in checks:
        line = f"{c.status.upper():<4}  {c.name}: {c.detail}"
        if c.status in ("fail", "warn") and c.fix:
            line += f" Fix: {c.fix}"
        lines.append(line)
    return lines


def checks_json(checks: Sequence[Check]) -> dict[str, Any]:
    return {"ok": not failed(checks),
            "checks": [{"name": c.name, "status": c.status, "ok": c.ok, "detail": c.detail,
                        "fix": c.fix} for c in checks]}
