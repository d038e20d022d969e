"""Can each lock install where the real images install it? The images run Python 3.12 on
Ubuntu 24.04 (glibc 2.39, x86_64); CI builds its stand-in images on Debian's 3.11, so
without this check a pin with no cp312 wheel would first fail on a cluster.

For every pin of a lock (`name==version` with `--hash=sha256:` lines) the package index is
asked for the version's files (one index page per package; no wheel is downloaded): at
least one must be a wheel that pip would install there (its tags among CPython 3.12's on
manylinux x86_64) whose sha256 is among the lock's hashes, as `pip install
--require-hashes --only-binary=:all:` in the image needs. Then the small wheels (below
--download-below MiB) are fetched with pip itself, with the image's options (the
multi-GB CUDA wheels are checked by index only). Pins already checked are remembered
under the cache folder (keyed by name, version and hashes), and pip's downloads stay
there too, so CI's time stays flat.

Usage: python ci/lock_check.py [--index-url URL] [--cache DIR] [--download-below MIB] LOCK...
Exit 0: every pin has a wheel for the image; 1: the pins that do not, one per line.
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

PYTHON = (3, 12)  # the CUDA base images are Ubuntu 24.04: python3 is 3.12, glibc 2.39
GLIBC_MINOR = 39
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MINOR, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
PIN = re.compile(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s*\\\n\s*--hash=sha256:"
                 r"[0-9a-f]{64})+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def supported_tags() -> set[Tag]:
    return set(cpython_tags(PYTHON, abis=["cp312"], platforms=PLATFORMS)) | set(
        compatible_tags(PYTHON, "cp312", platforms=PLATFORMS))


def pins(lock: Path) -> list[tuple[str, str, frozenset[str]]]:
    text = lock.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2), frozenset(HASH.findall(m.group(3))))
            for m in PIN.finditer(text)]


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def index_files(index: str, name: str) -> list[tuple[str, str, int | None]]:
    """(filename, sha256, size) of every file the index lists for `name` (PEP 691 JSON
    where the index serves it, else the PEP 503 page's links with #sha256= fragments, each
    file's size then asked with a HEAD request)."""
    url = f"{index.rstrip('/')}/{canonicalize_name(name)}/"
    if not url.startswith(("https://", "http://")):
        raise SystemExit(f"lock check: --index-url {index}: an http(s) index is needed")
    request = urllib.request.Request(url, headers={  # noqa: S310 (http(s), checked above)
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
        body = response.read()
        kind = response.headers.get("Content-Type", "")
    if "json" in kind:
        data = json.loads(body)
        return [(f["filename"], f.get("hashes", {}).get("sha256", ""), f.get("size"))
                for f in data.get("files", [])]
    parser = _Anchors()
    parser.feed(body.decode("utf-8", errors="replace"))
    out = []
    for link in parser.links:
        path, _, fragment = link.partition("#")
        filename = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        sha = fragment[len("sha256="):] if fragment.startswith("sha256=") else ""
        out.append((filename, sha, _size(urllib.parse.urljoin(url, path))
                     if filename.endswith(".whl") else None))
    return out


def _size(url: str) -> int | None:
    request = urllib.request.Request(url, method="HEAD")  # noqa: S310 (the index's link)
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
        length = response.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


SDIST = (".tar.gz", ".zip")


def check_pin(index: str, name: str, version: str, hashes: frozenset[str],
              tags: set[Tag]) -> tuple[str | None, int | None, bool]:
    """(problem or None, size of the chosen wheel or None, whether the image builds the
    pin from its source archive): a wheel for the image that carries one of the lock's
    hashes is chosen; without one, an sdist with one of the hashes (pure-Python packages
    published that way: the images' `pip install --require-hashes` builds it); else the
    pin cannot install in the image."""
    wheels, sdists = [], []
    prefix = canonicalize_name(name)
    for filename, sha, size in index_files(index, name):
        if filename.endswith(".whl"):
            try:
                wname, wversion, _, wtags = parse_wheel_filename(filename)
            except ValueError:
                continue
            if canonicalize_name(wname) == prefix and str(wversion) == version:
                wheels.append((filename, sha, size, wtags))
        elif filename.endswith(SDIST):
            stem = filename[:-len(next(e for e in SDIST if filename.endswith(e)))]
            sname, _, sversion = stem.rpartition("-")
            if canonicalize_name(sname) == prefix and sversion == version and sha in hashes:
                sdists.append(filename)
    fits = [w for w in wheels if w[3] & tags]
    good = [w for w in fits if w[1] in hashes]
    if good:
        return None, min((w[2] for w in good if w[2] is not None), default=None), False
    if sdists and not fits:
        return None, None, True
    if fits:
        return (f"{name}=={version}: the lock's hashes match none of the wheels for the "
                f"image ({', '.join(sorted(w[0] for w in fits))[:300]}): regenerate it "
                "(nox -s lock)"), None, False
    have = ", ".join(sorted(w[0] for w in wheels))[:300] or "no wheel and no source archive"
    return (f"{name}=={version}: no wheel for CPython {PYTHON[0]}.{PYTHON[1]} on manylinux "
            f"x86_64 and no source archive with the lock's hash (the index has: {have})"
            ), None, False


def pip_download(locks_pins: list[tuple[str, str, frozenset[str]]], index: str,
                 dest: Path) -> int:
    """pip download, with the image's interpreter and platform options, of these pins."""
    if not locks_pins:
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        for name, version, hashes in locks_pins:
            fh.write(f"{name}=={version} " + " ".join(f"--hash=sha256:{h}"
                                                     for h in sorted(hashes)) + "\n")
        requirements = fh.name
    argv = [sys.executable, "-m", "pip", "download", "--isolated", "-q", "--no-deps",
            "--only-binary=:all:", "--python-version", f"{PYTHON[0]}.{PYTHON[1]}",
            "--implementation", "cp", "--abi", "cp312",
            *[a for p in PLATFORMS for a in ("--platform", p)],
            "--require-hashes", "--index-url", index, "-d", str(dest), "-r", requirements]
    try:
        return subprocess.run(argv, check=False).returncode
    finally:
        Path(requirements).unlink()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("locks", nargs="+", type=Path)
    parser.add_argument("--index-url", default="https://pypi.org/simple")
    parser.add_argument("--cache", type=Path, default=Path(".nox") / "lock-check")
    parser.add_argument("--download-below", type=float, default=20.0, metavar="MIB")
    args = parser.parse_args(argv)
    tags = supported_tags()
    args.cache.mkdir(parents=True, exist_ok=True)
    seen_file = args.cache / "checked.json"
    seen: dict[str, list[Any]] = (json.loads(seen_file.read_text())
                                  if seen_file.is_file() else {})
    problems: list[str] = []
    from_source: list[str] = []
    small: dict[Path, list[tuple[str, str, frozenset[str]]]] = {}
    checked = 0
    for lock in args.locks:
        for name, version, hashes in pins(lock):
            key = hashlib.sha256(f"{args.index_url} {name}=={version} "
                                 f"{' '.join(sorted(hashes))}".encode()).hexdigest()
            if key in seen:
                size, source = seen[key]
            else:
                checked += 1
                problem, size, source = check_pin(args.index_url, name, version, hashes,
                                                  tags)
                if problem:
                    problems.append(f"{lock.name}: {problem}")
                    continue
                seen[key] = [size, source]
            if source:
                from_source.append(f"{name}=={version}")
            if size is not None and size < args.download_below * 2**20:
                small.setdefault(lock, []).append((name, version, hashes))
    seen_file.write_text(json.dumps(seen, sort_keys=True), encoding="utf-8")
    print(f"lock check: {sum(len(pins(lock)) for lock in args.locks)} pins in "
          f"{len(args.locks)} lock(s), {checked} asked of the index, "
          f"{sum(len(v) for v in small.values())} small "
          f"wheels through pip download (cache {args.cache})", file=sys.stderr)
    if from_source:
        print("lock check: built from their source archives in the image (no wheel): "
              + ", ".join(sorted(set(from_source))), file=sys.stderr)
    if problems:
        print("\n".join(problems))
        return 1
    wheels = args.cache / "wheels"
    have = {hashlib.sha256(f.read_bytes()).hexdigest()
            for f in (wheels.glob("*.whl") if wheels.is_dir() else [])}
    for lock, chosen in small.items():  # one lock at a time: their versions differ
        missing = [pin for pin in chosen if not pin[2] & have]  # not downloaded before
        if pip_download(missing, args.index_url, wheels) != 0:
            print(f"lock check: {lock.name}: pip download of its small wheels for CPython "
                  "3.12 failed")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
