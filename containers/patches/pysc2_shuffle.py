"""Make pysc2 4.0.0 importable on Python >= 3.11 (run once by sc2.def's %post).

pysc2 4.0.0, the last release on PyPI, calls `random.shuffle(palette, lambda: 0.5)` in
pysc2/lib/colors.py at import time; Python 3.11 removed shuffle's second argument, so
`import pysc2.lib.features` raises TypeError. This rewrites that one call into the loop
Python <= 3.10 ran for it (j = floor(0.5 * (i + 1)) for i from the end), so the palette is
the same as before. Idempotent; exits 1 when pysc2 or the file is not found.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

CALL = re.compile(r"^(?P<indent>[ \t]*)random\.shuffle\((?P<seq>\w+), lambda: 0\.5\).*$",
                  re.MULTILINE)


def replacement(match: re.Match[str]) -> str:
    pad, seq = match.group("indent"), match.group("seq")
    return (f"{pad}for _i in reversed(range(1, len({seq}))):  # shuffle(x, lambda: 0.5)\n"
            f"{pad}  _j = (_i + 1) // 2\n"
            f"{pad}  {seq}[_i], {seq}[_j] = {seq}[_j], {seq}[_i]")


def main() -> int:
    spec = importlib.util.find_spec("pysc2")
    if spec is None or not spec.submodule_search_locations:
        print("pysc2 is not installed", file=sys.stderr)
        return 1
    colors = Path(next(iter(spec.submodule_search_locations))) / "lib" / "colors.py"
    if not colors.is_file():
        print(f"{colors} not found", file=sys.stderr)
        return 1
    text = colors.read_text(encoding="utf-8")
    patched, count = CALL.subn(replacement, text)
    if count:
        colors.write_text(patched, encoding="utf-8")
    print(f"{colors}: {count} shuffle call(s) rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
