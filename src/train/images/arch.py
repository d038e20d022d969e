"""Which GPUs a torch build runs on, read from its own binaries: the SM architectures of the
machine code (and PTX) in the `.nv_fatbin` section of a CUDA library, and the CUDA version
the wheel was built for.

This is what decides whether an image can run on a partition's GPUs (a V100 is sm_70: a
build without sm_70 code or older PTX fails at its first kernel with "no kernel image is
available"). `torch.cuda.get_arch_list()` says the same only on a machine with a GPU; this
reads the wheel anywhere, without CUDA and without importing torch. The lock files record
the result in their header (`# cuda X.Y` and `# arch ...`), written by `nox -s lock`.

The fat binary layout (little-endian): a container header of 16 bytes (magic 0xBA55ED50,
u16 version, u16 header size, u64 size of what follows), then entries, each a header (u16
kind: 1 PTX, 2 ELF; u16 version; u32 header size; u64 payload size; ...; u32 SM number at
offset 28) followed by its payload. A library holds many containers one after another.
"""

from __future__ import annotations

import re
import shutil
import struct
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from train.common.errors import ConfigError

FATBIN_MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQ")
_ARCH_OFFSET = 28
KIND_PTX = 1
KIND_ELF = 2
# where a torch wheel keeps its CUDA kernels; torchvision's operators are in _C.so
LIBRARIES = ("torch/lib/libtorch_cuda.so", "torchvision/_C.so")
# torch's linear algebra kernels (torch.linalg on CUDA) are a library of their own, built
# for fewer GPUs: 2.13.0's has no sm_75, so an RTX 2080 trains but torch.linalg fails there
LINALG = "torch/lib/libtorch_cuda_linalg.so"
_VERSION_PY = re.compile(r"(?m)^cuda(?:: [^=]*)?\s*=\s*['\"]([0-9.]+)['\"]")
# a local version such as 0.25.0+cu128 (torchvision's version.py has no cuda string)
_LOCAL_CU = re.compile(r"(?m)^__version__\s*=\s*['\"][^'\"+]*\+cu(\d+)(\d)['\"]")


def _version_cuda(text: str) -> str | None:
    match = _VERSION_PY.search(text)
    if match:
        return match.group(1)
    local = _LOCAL_CU.search(text)
    return f"{local.group(1)}.{local.group(2)}" if local else None


@dataclass(frozen=True)
class BuildArch:
    """What one build carries: the CUDA it was built for (None: a CPU build), machine code
    (sm_XY) and PTX (compute_XY) entries."""

    cuda: str | None
    sm: tuple[int, ...]
    ptx: tuple[int, ...]
    linalg: tuple[str, ...] | None = None  # the linear algebra library's list; None: unread

    @property
    def arch_list(self) -> tuple[str, ...]:
        """In torch.cuda.get_arch_list()'s spelling."""
        return (*(f"sm_{n}" for n in self.sm), *(f"compute_{n}" for n in self.ptx))

    def header(self, source: str) -> str:
        """The lines a lock file records about its torch build."""
        linalg = ("" if self.linalg is None else
                  f"# arch-linalg {' '.join(self.linalg) or 'none'}\n")
        return (f"# cuda {self.cuda or 'none (CPU build)'}\n"
                f"# arch {' '.join(self.arch_list) or 'none'}\n{linalg}"
                f"# (read from {source} by train.images.arch)\n")


def fatbin_section(data: bytes | memoryview) -> memoryview:
    """The `.nv_fatbin` section of a 64-bit little-endian ELF file (empty when absent)."""
    view = memoryview(data)
    if bytes(view[:4]) != b"\x7fELF" or view[4] != 2 or view[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", view, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", view, 0x3A)
    sections = []
    for index in range(shnum):
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", view, shoff + index * shentsize)
        sections.append((name, offset, size))
    _n, str_offset, str_size = sections[shstrndx]
    names = bytes(view[str_offset:str_offset + str_size])
    for name, offset, size in sections:
        end = names.find(b"\0", name)
        if names[name:end] == b".nv_fatbin":
            return view[offset:offset + size]
    return view[0:0]


def fatbin_entries(section: bytes | memoryview) -> Iterator[tuple[int, int]]:
    """(kind, SM number) of every entry of every container in a fat binary section.
    Containers are 8-byte aligned; anything else between them is skipped."""
    view = memoryview(section)
    pos = 0
    while pos + _CONTAINER.size <= len(view):
        magic, _version, header_size, size = _CONTAINER.unpack_from(view, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        entry = pos + header_size
        end = min(len(view), entry + size)
        while entry + _ARCH_OFFSET + 4 <= end:
            kind, _v, entry_header, payload = _ENTRY.unpack_from(view, entry)
            if entry_header < _ARCH_OFFSET + 4:
                break  # not an entry header: the rest of this container is unreadable
            arch, = struct.unpack_from("<I", view, entry + _ARCH_OFFSET)
            yield kind, arch
            entry += entry_header + payload
        pos = max(pos + 8, (end + 7) // 8 * 8)


def library_arch(data: bytes | memoryview, cuda: str | None) -> BuildArch:
    """The architectures in one ELF library's fat binaries."""
    entries = set(fatbin_entries(fatbin_section(data)))
    return BuildArch(cuda, tuple(sorted({arch for kind, arch in entries if kind != KIND_PTX})),
                     tuple(sorted({arch for kind, arch in entries if kind == KIND_PTX})))


def wheel_arch(wheel: Path) -> BuildArch:
    """The architectures of a torch (or torchvision) wheel's CUDA kernels and the CUDA it
    was built for (from its version.py); a CPU build has none."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError("wheel", f"{wheel} is not a readable wheel: {exc}") from None
    with archive:
        names = set(archive.namelist())
        version = next((v for v in ("torch/version.py", "torchvision/version.py")
                        if v in names), None)
        cuda = _version_cuda(archive.read(version).decode(errors="replace")) if version else None
        library = next((n for n in LIBRARIES if n in names), None)
        if library is None:
            return BuildArch(cuda, (), ())
        build = _member_arch(archive, library, cuda)
        linalg = _member_arch(archive, LINALG, cuda).arch_list if LINALG in names else None
        return BuildArch(cuda, build.sm, build.ptx, linalg)


def _member_arch(archive: zipfile.ZipFile, name: str, cuda: str | None) -> BuildArch:
    # the library can be over a GB: copied to disk, not held in memory twice
    import mmap

    with tempfile.TemporaryFile() as copy:
        with archive.open(name) as member:
            shutil.copyfileobj(member, copy, 1 << 20)
        copy.seek(0)
        with mmap.mmap(copy.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return library_arch(view, cuda)
            finally:
                view.release()


def read_header(lock_text: str) -> BuildArch | None:
    """A lock's recorded build (`# cuda`, `# arch` lines), None when it records none."""
    cuda = re.search(r"(?m)^# cuda (\S+)", lock_text)
    arch = re.search(r"(?m)^# arch (.*)$", lock_text)
    linalg = re.search(r"(?m)^# arch-linalg (.*)$", lock_text)
    if cuda is None or arch is None:
        return None
    entries = [e.partition("_") for e in arch.group(1).split()]
    sm = tuple(int(n) for kind, _, n in entries if n.isdigit() and kind != "compute")
    ptx = tuple(int(n) for kind, _, n in entries if n.isdigit() and kind == "compute")
    version = None if cuda.group(1) == "none" else cuda.group(1)
    linalg_list = None if linalg is None else tuple(
        e for e in linalg.group(1).split() if e != "none")
    return BuildArch(version, sm, ptx, linalg_list)


def main(argv: list[str] | None = None) -> int:
    """`python -m train.images.arch WHEEL`: print the lock header lines for a torch wheel."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m train.images.arch WHEEL", file=sys.stderr)
        return 2
    try:
        build = wheel_arch(Path(args[0]))
    except (ConfigError, ValueError) as exc:
        print(f"train.images.arch: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(build.header(Path(args[0]).name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
