"""Atomic, background checkpoints: snapshot in the loop, write in a thread, keep the last two.

Loading never runs code from the file (weights_only=True: NumPy arrays and RNG states are
stored as uint8 tensors). A checkpoint whose sha256 (`ckpt-N.pt.sha256`) is missing or does
not match, or whose content is not the trainer's, is skipped and renamed `damaged-ckpt-N.pt`,
so it never holds one of the KEEP places. A stop that cuts an episode saves the same `ckpt-N` again:
so that a kill between the two renames (checksum, then data) never pairs data with another's
checksum, the checksum file may list several sha256s until the data is renamed over.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from train.common.errors import CheckpointError, UsageError, first_line
from train.common.filehash import file_sha256
from train.workloads.runtime.memory import OUT_OF_MEMORY

log = logging.getLogger(__name__)

FORMAT = 2  # 1: pickled NumPy objects, loaded with weights_only=False (no longer read)
_ARRAY = "__ndarray__"
_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")
_RECURSE = object()  # a leaf function's answer: not a leaf, walk into it


def _map_tree(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """`obj` rebuilt with `leaf` applied to each node; where it returns _RECURSE,
    containers are walked into and anything else kept."""
    out = leaf(obj)
    if out is not _RECURSE:
        return out
    if isinstance(obj, dict):
        return {k: _map_tree(v, leaf) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_tree(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_map_tree(v, leaf) for v in obj)
    return obj


def _copy_leaf(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, np.ndarray):
        return obj.copy()
    return _RECURSE


def snapshot(obj: Any) -> Any:
    """Deep copy of a state tree: tensors to CPU copies, arrays copied, containers rebuilt."""
    return _map_tree(obj, _copy_leaf)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode_leaf(obj: Any) -> Any:
    """A state tree's node in the types torch.load(weights_only=True) accepts: NumPy arrays
    become {__ndarray__: uint8 tensor, dtype, shape}, NumPy scalars Python numbers."""
    if isinstance(obj, np.ndarray):
        data = np.ascontiguousarray(obj)
        return {_ARRAY: torch.from_numpy(data.reshape(-1).view(np.uint8).copy()),
                "dtype": data.dtype.str, "shape": list(data.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    return _RECURSE


def _decode_leaf(obj: Any) -> Any:
    if isinstance(obj, dict) and _ARRAY in obj:
        raw = obj[_ARRAY].numpy()
        return raw.view(np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
    return _RECURSE


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_SUMS = 8  # lines a checksum file may carry: a few saves of one name each cut short
KEEP = 2  # complete checkpoints kept: the newest, and one before it should it be damaged


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def checksums(path: Path) -> list[str]:
    """The sha256s the checksum file of `path` vouches for, newest first."""
    if not _regular(checksum_path(path)):  # a FIFO would block the read
        return []
    try:
        with open(checksum_path(path), "rb") as fh:
            text = fh.read(_MAX_SUMS * 200).decode("ascii")
    except (OSError, UnicodeDecodeError):
        return []
    sums = [line.split()[0] for line in text.splitlines() if line.split()]
    return [s for s in sums if _HEX64.fullmatch(s)][:_MAX_SUMS]


def save_atomic(state: Any, path: Path) -> None:
    """torch.save to a temp file, fsync, its sha256 beside it, rename over `path`, fsync the
    directory: a checkpoint under its final name always has its checksum, also while a
    checkpoint of the same name is replaced (see the module's notes)."""
    tag = f"{os.getpid()}-{threading.get_ident()}"
    tmp = path.with_name(f".{path.name}.tmp-{tag}")
    tmp_sum = path.with_name(f".{path.name}.sha256.tmp-{tag}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(_map_tree(state, _encode_leaf), fh)
            fh.flush()
            os.fsync(fh.fileno())
        digest = file_sha256(tmp)
        # the data under `path` now (a save of the same name again) stays vouched for
        # until the new data has replaced it
        present = [s for s in checksums(path) if s != digest] if _regular(path) else []
        lines = [digest, *present][:_MAX_SUMS]
        _write_synced(tmp_sum, "".join(f"{s}  {path.name}\n" for s in lines))
        os.replace(tmp_sum, checksum_path(path))
        _fsync_dir(path.parent)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        if len(lines) > 1:  # the old data is gone: the checksum vouches for the new alone
            _write_synced(tmp_sum, f"{digest}  {path.name}\n")
            os.replace(tmp_sum, checksum_path(path))
            _fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        tmp_sum.unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    """Verify the checksum, then load onto the CPU (weights_only=True)."""
    if not path.is_file():  # no FIFO, no device
        raise CheckpointError(f"{path} is not a regular file")
    if os.path.lexists(checksum_path(path)) and not checksum_path(path).is_file():
        raise CheckpointError(f"{checksum_path(path)} is not a regular file")
    expected = checksums(path)
    if not expected:
        raise CheckpointError(f"{path} has no checksum ({checksum_path(path).name}): it was "
                              "not completely written, or by an older version")
    if file_sha256(path) not in expected:
        raise CheckpointError(f"{path} does not match its checksum: the file is damaged")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as exc:
        first = first_line(exc)
        if OUT_OF_MEMORY.search(str(exc)):  # torch's allocator: the host, not the file
            raise MemoryError(f"{path} could not be loaded: {first}") from None
        raise CheckpointError(f"{path} cannot be loaded safely: {first}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a checkpoint of format {FORMAT}")
    try:
        return _map_tree(state, _decode_leaf)  # type: ignore[no-any-return]
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a malformed array
        raise CheckpointError(f"{path} holds an array that does not decode: "
                              f"{first_line(exc)}") from None


def _regular(path: Path) -> bool:  # not a link to one
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def episode_of(path: Path) -> int:
    match = _NAME.match(path.name)
    if not match:
        raise ValueError(f"not a checkpoint name: {path.name}")
    return int(match.group(1))


class CheckpointManager:
    """Checkpoints of one run in one directory, named by episode, the newest KEEP kept."""

    def __init__(self, directory: Path, background: bool = True) -> None:
        self.directory = directory
        self.background = background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def prepare(self) -> None:
        """Create the directory and remove temp files left by a killed writer, and the
        checksums of checkpoints that are gone. Something under a checkpoint's name that is
        not a regular file (a folder, a link) would block the save of that episode hours
        later: exit 2 now."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.check_names()
        for stale in self.directory.glob(".ckpt-*.tmp-*"):
            stale.unlink(missing_ok=True)
        for orphan in self.directory.glob("ckpt-*.pt.sha256"):
            if not orphan.with_name(orphan.name[:-len(".sha256")]).exists():
                orphan.unlink(missing_ok=True)

    def check_names(self) -> None:
        """Exit 2 for anything under a checkpoint's name that is not a regular file."""
        if not self.directory.is_dir():
            return
        for entry in self.directory.iterdir():
            if (_NAME.match(entry.name) or _NAME.match(entry.name.removesuffix(".sha256"))) \
                    and not _regular(entry):
                raise UsageError(f"out: {entry} is not a regular file but has a checkpoint's "
                                 "name; remove it (or use a new --out)")

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.iterdir() if _NAME.match(p.name) and _regular(p)]
        return sorted(found, key=episode_of)

    def load_latest(self, check: Callable[[dict[str, Any]], None] | None = None,
                    set_aside: bool = False) -> dict[str, Any] | None:
        """The newest checkpoint that loads (and that `check` accepts: it raises
        CheckpointError, ValueError, KeyError or TypeError for content that is not a
        checkpoint of this trainer); older ones are tried if the newest is damaged. With
        `set_aside` (one process of a run) a damaged one is renamed damaged-ckpt-N.pt."""
        candidates = self.complete()
        errors = []
        for path in reversed(candidates):
            try:
                state = load(path)
                if check is not None:
                    check(state)
            except Exception as exc:
                log.warning("checkpoint %s is unreadable (%s); trying an older one", path, exc)
                errors.append(f"{path.name}: {exc}")
                # an I/O error (EIO, ESTALE) or a host short of memory is not the file's
                # fault: it is tried next time
                if set_aside and not isinstance(exc, (OSError, MemoryError)):
                    self._set_aside(path)
                continue
            log.info("resuming from %s", path)
            return state
        if errors:
            raise CheckpointError(f"no readable checkpoint in {self.directory}: "
                                  + "; ".join(errors))
        return None

    def _set_aside(self, path: Path) -> None:
        tag = "damaged"
        n = 1
        while path.with_name(f"{tag}-{path.name}").exists():  # an earlier one is kept too
            n += 1
            tag = f"damaged{n}"
        try:
            for src in (checksum_path(path), path):
                if src.exists():
                    os.replace(src, src.with_name(f"{tag}-{src.name}"))
        except OSError as exc:  # a read-only folder: it stays, and is skipped again
            log.warning("could not set %s aside: %s", path, exc)
            return
        log.warning("set aside as %s", path.with_name(f"{tag}-{path.name}"))

    def save(self, state: dict[str, Any], episode: int) -> None:
        self.wait()
        snap = snapshot({**state, "format": FORMAT})
        path = self.directory / f"ckpt-{episode:08d}.pt"
        if self.background:
            self._thread = threading.Thread(target=self._write, args=(snap, path),
                                            name="checkpoint-writer", daemon=True)
            self._thread.start()
        else:
            self._write(snap, path)
            self._raise_pending()

    def _write(self, snap: dict[str, Any], path: Path) -> None:
        try:
            save_atomic(snap, path)
            pruned = self.complete()[:-KEEP]
            for old in pruned:
                old.unlink(missing_ok=True)
            if pruned:  # the data is gone on disk before its checksum: never one without
                _fsync_dir(self.directory)
            for old in pruned:
                checksum_path(old).unlink(missing_ok=True)
        except BaseException as exc:
            self._error = exc

    def _raise_pending(self) -> None:
        if self._error is not None:
            exc, self._error = self._error, None
            raise CheckpointError(f"writing a checkpoint in {self.directory} failed: "
                                  f"{exc}") from exc

    def wait(self) -> None:
        """Block until the write in flight (if any) is on disk; re-raise its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise_pending()
