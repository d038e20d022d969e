"""`train image new`'s resolution: which Python the image has, and pip's dry run for it.

pip runs as `python -m pip` of the Python that runs train. `--python-version`, `--platform`,
`--abi` and `--implementation` are taken by `pip install` only with `--target` before pip
23.3 ("Can not use any platform or abi specific options unless installing via '--target'"):
the dry run names a target folder it never writes, so the pip a fresh venv brings on Python
3.10-3.12 (23.0.1, 23.2.1) resolves as a newer one does. `--dry-run --report` with report
format 1 needs pip >= 23.0: an older pip is refused first, naming the upgrade.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.common import _proc
from train.common.errors import UsageError
from train.common.filehash import file_sha256

# the oldest manylinux a wheel is tagged for and pip still installs (manylinux2014's glibc)
OLDEST_GLIBC_MINOR = 17
MIN_PIP = (23, 0)
PIP_TIMEOUT_S = 900.0  # a resolution against the index of many requirements
MAX_REPORT_BYTES = 64 << 20
# the Ubuntu release of base.def's BASE_IMAGE -> its python3 (major.minor, full) and
# glibc's minor version (2.X)
UBUNTU_PYTHON = {"22.04": ("3.10", "3.10.12", 35), "24.04": ("3.12", "3.12.3", 39)}


@dataclass(frozen=True)
class Target:
    """The image's interpreter and platform: what pip resolves for and markers meet."""

    python: str  # major.minor
    full: str  # python_full_version
    glibc_minor: int  # the image's glibc is 2.glibc_minor

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    def platforms(self) -> list[str]:
        """Every platform tag pip in the image installs, in pip's order of preference: pip
        given one --platform takes that tag alone, so a wheel tagged only for an older
        glibc (manylinux_2_17/manylinux2014, most compiled packages) would be refused."""
        return [*(f"manylinux_2_{minor}_x86_64"
                  for minor in range(self.glibc_minor, OLDEST_GLIBC_MINOR - 1, -1)),
                "manylinux2014_x86_64", "linux_x86_64"]

    def describe(self) -> str:
        return (f"CPython {self.python} on Linux x86_64, glibc 2.{self.glibc_minor}: "
                f"manylinux_2_{OLDEST_GLIBC_MINOR}..2_{self.glibc_minor}, manylinux2014 or "
                "linux wheels")

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker variables of the image (Linux x86_64, CPython)."""
        return {"implementation_name": "cpython", "implementation_version": self.full,
                "os_name": "posix", "platform_machine": "x86_64",
                "platform_python_implementation": "CPython", "platform_release": "",
                "platform_system": "Linux", "platform_version": "",
                "python_full_version": self.full, "python_version": self.python,
                "sys_platform": "linux", "extra": ""}


def image_target(base_image: str) -> Target:
    """The Python of an image built from base.def's BASE_IMAGE (Ubuntu's python3)."""
    match = re.search(r"ubuntu[-_]?(\d\d\.\d\d)", base_image)
    known = UBUNTU_PYTHON.get(match.group(1)) if match else None
    if known is None:
        releases = ", ".join(f"ubuntu{u} ({p})" for u, (p, *_) in UBUNTU_PYTHON.items())
        raise UsageError(f"image new: base.def's BASE_IMAGE {base_image[:120]!r}: the "
                         "Python it brings is not known, so requirements cannot be resolved "
                         f"for it (known: {releases})")
    return Target(*known)


def check_pip() -> None:
    """The pip that resolves (this Python's) too old or missing: exit 2."""
    upgrade = f"{sys.executable} -m pip install --upgrade pip"
    try:
        import pip
        version = str(pip.__version__)
    except (ImportError, AttributeError):
        raise UsageError(f"image new: needs pip in {sys.executable} (python -m ensurepip, "
                         f"then {upgrade})") from None
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match.group(1)), int(match.group(2))) < MIN_PIP:
        raise UsageError(f"image new: pip {version[:40]} of {sys.executable} is too old: "
                         f"resolving for the image needs pip >= {MIN_PIP[0]}.{MIN_PIP[1]} "
                         f"(`pip install --dry-run --report`); upgrade it: {upgrade}")


def _command(target: Target, tmp: Path, index_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--dry-run",
            "--disable-pip-version-check", "--ignore-installed", "--no-input",
            "--only-binary=:all:", "--python-version", target.python,
            "--implementation", "cp", "--abi", target.abi,
            *(arg for tag in target.platforms() for arg in ("--platform", tag)),
            "--target", str(tmp / "target"),  # never written: a dry run (pip < 23.3)
            "--report", str(tmp / "report.json"), "-c", str(tmp / "constraints.txt"),
            "-r", str(tmp / "requirements.txt"), *index_args]


def pip_resolve(requirements: Sequence[str], constraints: Sequence[str], target: Target,
                index_args: Sequence[str]) -> list[dict[str, Any]]:
    """pip's dry-run report ("install" items) for the image's Python and platform, wheels
    only, every base pin (name==version) a constraint. pip's refusal is a usage error
    quoting pip."""
    check_pip()
    with tempfile.TemporaryDirectory(prefix="train-derive-") as name:
        tmp = Path(name)
        (tmp / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements),
                                              encoding="utf-8")
        (tmp / "constraints.txt").write_text("".join(f"{c}\n" for c in constraints),
                                             encoding="utf-8")
        env = {**os.environ, "PIP_REQUIRE_VIRTUALENV": "0", "PIP_CONSTRAINT": "",
               "PIP_NO_INPUT": "1"}
        if "--no-index" in index_args:  # the folder given and nothing else: no pip config
            env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
            env["PIP_CONFIG_FILE"] = os.devnull
        proc = _proc.run(_command(target, tmp, index_args), timeout=PIP_TIMEOUT_S,
                         check=False, env=env)
        if proc.returncode != 0:
            req_file = tmp / "requirements.txt"
            text = re.sub(re.escape(f"-r {req_file}") + r" \(line (\d+)\)",
                          lambda m: repr(requirements[int(m.group(1)) - 1]),
                          proc.stderr[-20000:] + proc.stdout[-5000:])
            raise UsageError(pip_refusal(text, target))
        report = tmp / "report.json"
        if not report.is_file() or report.stat().st_size > MAX_REPORT_BYTES:
            raise UsageError("image new: pip wrote no usable report (--report): "
                             + proc.stderr[-300:])
        try:
            data = json.loads(report.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"image new: pip's report is not JSON: {exc}") from None
    items = data.get("install", []) if isinstance(data, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise UsageError("image new: pip's report has no list of what it would install")
    return items


def pip_refusal(text: str, target: Target) -> str:
    """pip's failure as one message: no wheel, a conflict with the base's pins (pip's
    resolver says so), or pip's own error quoted."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = "; ".join(ln for ln in lines if ln.startswith("ERROR"))
    missing = [m.group(1) for ln in lines
               if (m := re.search(r"No matching distribution found for (\S+)", ln))]
    if missing:  # pip's list of the versions there are, whole: the one to pick is in it
        return (f"--requirements: {', '.join(missing)}: no wheel for the image's Python "
                f"({target.describe()}) that fits the base's pins; pick a version that "
                f"publishes one (pip: {errors})")
    conflict = [ln for ln in lines if ln.startswith("The user requested")
                or " depends on " in ln or "ResolutionImpossible" in ln
                or "conflicting dependencies" in ln]
    if conflict:
        return ("--requirements: pip cannot resolve them against the base image's pins "
                "(the base's versions are constraints): " + "; ".join(conflict)[:600])
    return "--requirements: pip refused them: " + (errors or "; ".join(lines[-5:]))[:600]


def sha256_of(item: dict[str, Any]) -> str:
    """The sha256 of the wheel pip chose, from its report item."""
    info = item.get("download_info", {})
    archive = info.get("archive_info", {}) if isinstance(info, dict) else {}
    hashes = archive.get("hashes", {}) if isinstance(archive, dict) else {}
    found = hashes.get("sha256") if isinstance(hashes, dict) else None
    if not found and str(archive.get("hash", "")).startswith("sha256="):
        found = str(archive["hash"]).split("=", 1)[1]
    if found:
        return str(found)
    url = str(info.get("url", "")) if isinstance(info, dict) else ""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return file_sha256(Path(urllib.request.url2pathname(parsed.path)))
    raise UsageError(f"--requirements: the index gave no sha256 for {url[:120]}: it cannot "
                     "be hash-pinned")
