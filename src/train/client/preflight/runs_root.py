"""Preflight, check 4: the runs root can be created and written, on a file system the
compute nodes share (under the site's scratch where the profile names one); and where a
path lives as the compute nodes see it, which the image check asks too."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from train.client.clusters.schema import Profile
from train.client.preflight.result import RUNS_ROOT, Check
from train.common.errors import ConfigError
from train.common.fields import check_writable_dir

MOUNTS = Path("/proc/self/mounts")

# File systems by what the compute nodes see of them. Network and cluster file systems are
# the same on every node; a local disk is this machine's alone; the volatile ones are also
# gone at the next reboot (or with the container the login shell runs in).
SHARED_FS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "wekafs",
                       "panfs", "cifs", "smb3", "smbfs", "glusterfs", "gfs2", "ocfs2", "afs",
                       "pvfs2", "orangefs", "vastnfs"})
# FUSE file systems (fuse.NAME) that reach a network store
SHARED_FUSE = frozenset({"ceph-fuse", "glusterfs", "sshfs", "s3fs", "gcsfuse", "rclone",
                         "juicefs", "beegfs", "weka", "gpfs", "lustre", "cvmfs2", "goofys",
                         "mountpoint-s3", "blobfuse", "blobfuse2"})
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "vfat", "jfs",
                      "reiserfs", "bcachefs"})
VOLATILE_FS = frozenset({"tmpfs", "ramfs", "devtmpfs", "overlay", "overlayfs", "aufs",
                         "squashfs", "fuse.fuse-overlayfs", "fuse.squashfuse"})
# node-local scratch on every cluster, whatever file system holds it
TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108  (names compared, never used)


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str


def read_mounts(path: Path = MOUNTS) -> list[Mount]:
    """The mount table (/proc/self/mounts format); empty where it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    rows = (line.split() for line in text.splitlines())
    return [Mount(_unescape(parts[1]), parts[2]) for parts in rows if len(parts) >= 3]


def _unescape(field_text: str) -> str:
    """The kernel writes space, tab, newline and backslash in mount points as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_text)


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


def mount_of(path: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount holding `path` (absolute, symlinks resolved): the last of the longest."""
    best: Mount | None = None
    for m in mounts:
        if _under(path, m.point) and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def _storage(path: str, mounts: Sequence[Mount], profile: Profile) -> tuple[str, str]:
    """(kind, words) for where `path` lives: shared, single_host, volatile, temp, local or
    unknown."""
    real = os.path.realpath(path)
    mount = mount_of(real, mounts)
    if profile.single_host:
        return "single_host", (f"{profile.name} runs every node on this machine: its file "
                                "systems are the nodes' own")
    if mount is None:
        return "unknown", "the mount table could not be read: whether the compute nodes " \
            "see it is not known"
    fs = mount.fstype
    on = f"{fs} at {mount.point}"
    if fs in SHARED_FS or (fs.startswith("fuse.") and fs[5:] in SHARED_FUSE):
        return "shared", f"on a shared file system ({on})"
    if fs in VOLATILE_FS:
        return "volatile", f"on {on}: this machine's alone, and gone at its next restart"
    temp = next((t for t in TEMP_DIRS if _under(real, t)), None)
    if temp is not None:
        return "temp", f"under {temp} ({on}): this machine's local scratch"
    if fs in LOCAL_FS:
        return "local", f"on a local disk ({on}): compute nodes may not see it"
    return "unknown", f"on {on}: whether the compute nodes see it is not known"


def _unreachable(path: Path, where: Path, exc: OSError, elsewhere: str) -> Check:
    if exc.errno == errno.ELOOP:
        return Check(RUNS_ROOT, False, f"{path} cannot be reached: a loop of symbolic links "
                     f"(at {where} or above it: {exc.strerror})",
                     f"correct or remove the looping link (ls -l each part of {where}); or "
                     f"choose another directory: {elsewhere}")
    return Check(RUNS_ROOT, False, f"{path} cannot be reached: {exc.strerror or exc}",
                 f"choose another directory: {elsewhere}")


def _check_runs_root(root: Path, profile: Profile, mounts: Sequence[Mount]) -> Check:
    path = Path(os.path.abspath(os.path.expanduser(str(root))))
    scratch = profile.scratch_root
    elsewhere = (f"--runs DIR (and --out) under {scratch}/$USER" if scratch
                 else "--runs DIR (and --out) on a shared file system")
    existing = path
    while True:  # up to the nearest part that exists; no symbolic link may dangle on the way
        try:
            os.stat(existing)
            break
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            return _unreachable(path, existing, exc, elsewhere)
        if os.path.islink(existing):
            try:
                target = os.readlink(existing)
            except OSError:
                target = "?"
            return Check(RUNS_ROOT, False, f"{path} cannot be created: {existing} is a "
                         f"symbolic link to {target}, which does not exist",
                         f"create the link's target (mkdir -p {target}) or remove the link "
                         f"(rm {existing}); or choose another directory: {elsewhere}")
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing != path and not existing.is_dir():
        return Check(RUNS_ROOT, False, f"{path} cannot be created: {existing} is a file",
                     f"choose another directory: {elsewhere}")
    if existing == path and not path.is_dir():
        return Check(RUNS_ROOT, False, f"{path} is a file, not a directory",
                     f"pass a directory: {elsewhere}")
    try:  # (a file created and removed there: the permission bits do not settle it)
        check_writable_dir(existing, "--runs")
    except ConfigError as exc:
        where = path if existing == path else f"{existing} (where {path} would be created)"
        return Check(RUNS_ROOT, False, f"{where} is not writable ({exc})",
                     f"chmod u+w {existing}, or choose a directory of yours: {elsewhere}")
    state = "writable" if existing == path else f"does not exist yet; {existing} is writable"
    kind, note = _storage(str(existing), mounts, profile)
    scratch_note = ""
    if scratch and kind != "single_host":
        real = os.path.realpath(existing)
        inside = _under(str(path), scratch) or _under(real, os.path.realpath(scratch))
        scratch_note = (f"; under the site's scratch ({scratch})" if inside else
                        f"; not under the site's scratch ({scratch}): home directories are "
                        "often small")
    detail = f"{path}: {state}; {note}{scratch_note}"
    fix = (f"put runs where every node sees them: {elsewhere} (jobs write checkpoints and "
           "logs there from the compute nodes)")
    if kind in ("volatile", "temp"):
        return Check(RUNS_ROOT, False, detail, fix)
    if kind in ("local", "unknown"):
        return Check(RUNS_ROOT, True, detail, fix, warn=True)
    return Check(RUNS_ROOT, True, detail)
