"""GPU types as cluster profiles name them: compute capability per type, and the bf16 rule
(once, here: the login node chooses a job's precision with it, so no torch or numpy)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType

# bf16 autocast without a GradScaler needs Ampere or newer (compute capability 8.0).
BF16_MIN_CAPABILITY = (8, 0)

# NVIDIA's CUDA GPU list (developer.nvidia.com/cuda-gpus), by the GRES/feature names sites
# use for them.
COMPUTE_CAPABILITY: Mapping[str, tuple[int, int]] = MappingProxyType({
    name: cap for cap, names in (
        ((3, 7), "k80"), ((6, 0), "p100"), ((6, 1), "gtx1080 gtx1080ti p40"),
        ((7, 0), "v100 titanv"), ((7, 5), "t4 rtx2080 rtx2080ti rtx8000"),
        ((8, 0), "a100 a30"), ((8, 6), "a10 a40 a4000 a5000 a6000 rtx3090"),
        ((8, 9), "l4 l40 l40s"), ((9, 0), "h100 h200"))
    for name in names.split()})

# MIG slices (1g.10gb, 3g.40gb, ...) exist only on A100, A30, H100 and H200: 8.0 at least.
_MIG = re.compile(r"^\d+g\.\d+gb$")
_MIG_CAPABILITY = (8, 0)
# Site spellings such as nvidia_a100-sxm4-80gb, a100_80gb or v100-32gb name the model first.
_VENDOR = re.compile(r"^(?:nvidia|tesla)[_-]")
_MODEL = re.compile(r"^([a-z0-9]+)[_-]")


def capability(gpu_type: str) -> tuple[int, int] | None:  # None: an unknown name
    name = gpu_type.strip().lower()
    if _MIG.match(name):
        return _MIG_CAPABILITY
    name = _VENDOR.sub("", name)
    if name in COMPUTE_CAPABILITY:
        return COMPUTE_CAPABILITY[name]
    model = _MODEL.match(name)
    return COMPUTE_CAPABILITY.get(model.group(1)) if model else None


def bf16_capable(cap: tuple[int, int] | None) -> bool:
    """The trainer's rule: bf16 on compute capability >= 8.0; unknown counts as not."""
    return cap is not None and tuple(cap) >= BF16_MIN_CAPABILITY


def all_bf16_capable(gpu_types: Iterable[str]) -> bool:
    """True when every type is known and bf16-capable; an empty set is not."""
    types = list(gpu_types)
    return bool(types) and all(bf16_capable(capability(t)) for t in types)


# An entry of torch.cuda.get_arch_list() (or of a wheel's fatbins): sm_XY is machine code
# (SASS) for capability X.Y, compute_XY is PTX for it; an "a" suffix (sm_90a) is code for
# exactly that capability, an "f" suffix (sm_100f) for that family (same major).
_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")


def parse_arch(entry: str) -> tuple[str, tuple[int, int], str] | None:
    """'sm_86' -> ('sm', (8, 6), ''), 'compute_90' -> ('compute', (9, 0), ''),
    'sm_90a' -> ('sm', (9, 0), 'a'); None for anything else."""
    match = _ARCH.match(entry.strip().lower())
    if not match:
        return None
    kind, major, minor, suffix = match.groups()
    return kind, (int(major), int(minor)), suffix


def arch_runs(cap: tuple[int, int], arch_list: Iterable[str]) -> bool:
    """Can a GPU of capability `cap` run a build carrying `arch_list`? Machine code runs on
    the same major at an equal or higher minor, "a" code only on exactly its capability, PTX
    on any equal or newer one (the driver compiles it)."""
    have = tuple(cap)
    for kind, arch, suffix in filter(None, map(parse_arch, arch_list)):
        if kind == "compute":
            runs = have >= arch
        else:
            runs = have == arch if suffix == "a" else have[0] == arch[0] and have >= arch
        if runs:
            return True
    return False
