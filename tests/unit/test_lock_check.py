"""ci/lock_check.py: a lock that cannot install on the real images' Python 3.12 fails CI.
A package index on 127.0.0.1 (static PEP 503 pages) holds tiny real wheels."""

from __future__ import annotations

import base64
import hashlib
import http.server
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import REPO


def _wheel(folder: Path, filename: str) -> str:
    """A minimal installable wheel; returns its sha256."""
    name, version = filename.split("-")[:2]
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": b"",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 .encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: " + "-".join(filename[:-4].split("-")[2:]).encode()
                              + b"\n"}

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(data)},{len(data)}\n"
                     for path, data in files.items()) + f"{info}/RECORD,,\n"
    path = folder / filename
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in {**files, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """http://127.0.0.1:PORT/simple with goodpkg 1.0 (py3-none-any) and oldpkg 1.0 (a
    cp311 wheel only); yields the index URL and each file's sha256."""
    root = tmp_path / "www"
    sums = {}
    for project, filename in (("goodpkg", "goodpkg-1.0-py3-none-any.whl"),
                              ("oldpkg", "oldpkg-1.0-cp311-cp311-manylinux_2_17_x86_64.whl")):
        folder = root / "simple" / project
        folder.mkdir(parents=True)
        sums[project] = _wheel(folder, filename)
        (folder / "index.html").write_text(
            f'<html><body><a href="{filename}#sha256={sums[project]}">{filename}</a>'
            "</body></html>\n")
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", sums
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _check(index_url: str, cache: Path, *locks: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "ci" / "lock_check.py"), "--index-url",
                           index_url, "--cache", str(cache), *map(str, locks)],
                          capture_output=True, text=True, timeout=300, check=False)


def test_a_lock_with_no_cp312_wheel_fails_and_names_the_pin(
        index: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, sums = index
    lock = tmp_path / "bad.txt"
    lock.write_text(f"goodpkg==1.0 \\\n    --hash=sha256:{sums['goodpkg']}\n"
                    f"oldpkg==1.0 \\\n    --hash=sha256:{sums['oldpkg']}\n")
    proc = _check(url, tmp_path / "cache", lock)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "bad.txt: oldpkg==1.0: no wheel for CPython 3.12 on manylinux x86_64" in proc.stdout
    assert "oldpkg-1.0-cp311-cp311-manylinux_2_17_x86_64.whl" in proc.stdout
    assert "goodpkg" not in proc.stdout


def test_a_lock_whose_hash_matches_no_wheel_fails(index: tuple[str, dict[str, str]],
                                                  tmp_path: Path) -> None:
    url, _ = index
    lock = tmp_path / "stale.txt"
    lock.write_text(f"goodpkg==1.0 \\\n    --hash=sha256:{'0' * 64}\n")
    proc = _check(url, tmp_path / "cache", lock)
    assert proc.returncode == 1
    assert "goodpkg==1.0: the lock's hashes match none of the wheels" in proc.stdout


def test_a_good_lock_passes_downloads_its_small_wheels_once_and_is_cached(
        index: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, sums = index
    lock = tmp_path / "good.txt"
    lock.write_text(f"goodpkg==1.0 \\\n    --hash=sha256:{sums['goodpkg']}\n")
    cache = tmp_path / "cache"
    first = _check(url, cache, lock)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "1 pins in 1 lock(s), 1 asked of the index" in first.stderr
    wheel = cache / "wheels" / "goodpkg-1.0-py3-none-any.whl"
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == sums["goodpkg"]
    again = _check(url, cache, lock)
    assert again.returncode == 0, again.stderr
    assert "0 asked of the index" in again.stderr  # the pin was checked before


def test_the_shipped_image_locks_are_all_parsed() -> None:
    """Every pin of the locks the nox session checks is read (a pin the pattern missed
    would go unchecked)."""
    sys.path.insert(0, str(REPO / "ci"))
    try:
        import lock_check
    finally:
        sys.path.remove(str(REPO / "ci"))
    import re

    for name in ("base-cu130.txt", "base-cu128.txt", "sc2.txt", "navsim.txt"):
        lock = REPO / "containers" / "requirements" / name
        entries = re.findall(r"(?m)^[A-Za-z0-9][^ \n]*==", lock.read_text())
        assert len(lock_check.pins(lock)) == len(entries) > 0, name
