"""Preflight, checks 5 and 6: the image's CUDA build against the nodes' NVIDIA driver where
the profile records it, and the GPU architectures the image's torch carries against the
nodes' GPUs (`train submit` runs `check_arch` too)."""

from __future__ import annotations

import re

from train.client.clusters.schema import NodeType, Profile
from train.client.preflight.image import ImageFacts
from train.client.preflight.result import ARCH, CUDA, IMAGE, Check
from train.common.cuda_check import MIN_DRIVER, VARIANTS, parse_version, variant_for_driver
from train.common.errors import UsageError
from train.common.gpus import arch_runs, capability
from train.images.arch import BuildArch, read_header
from train.images.defs import containers_dir


def image_cuda(facts: ImageFacts) -> tuple[str, tuple[int, int] | None, str]:
    """("cuda", (major, minor), source) | ("cpu", None, source) | ("unknown", None, ""). The
    lock the image's torch came from comes before the CUDA base: torch carries its own CUDA,
    which is what meets the driver."""
    labels = facts.labels
    if "org.train.cuda" in labels:
        version = parse_version(labels["org.train.cuda"])
        if version is not None:
            return "cuda", version, f"label org.train.cuda={labels['org.train.cuda']}"
    lock = labels.get("org.train.lock", "")
    if re.search(r"(?:^|[^a-z])cpu(?:[^a-z]|$)", lock.lower()):
        return "cpu", None, f"label org.train.lock={lock}"
    base = labels.get("org.train.base-image", "")
    for text, pattern, source in (
            (lock.lower(), r"cu([0-9]{1,2})([0-9])(?![0-9])", f"label org.train.lock={lock}"),
            (base, r"cuda:([0-9]+)\.([0-9]+)", f"label org.train.base-image={base}"),
            (facts.env_text, r"\bCUDA_VERSION\b[^0-9\n]{0,24}([0-9]+)\.([0-9]+)", "")):
        match = re.search(pattern, text)
        if match:
            return "cuda", (int(match.group(1)), int(match.group(2))), source or (
                f"CUDA_VERSION {match.group(1)}.{match.group(2)} in the image's environment")
    return "unknown", None, ""


def image_arch(facts: ImageFacts) -> tuple[BuildArch | None, str]:
    """The GPU architectures the image's torch carries, and where that was read: a label
    org.train.arch, else the header of the lock named by org.train.lock (the shipped locks
    record what their torch wheel carries, read by train.images.arch)."""
    labels = facts.labels
    if labels.get("org.train.arch"):
        build = read_header(f"# cuda {labels.get('org.train.cuda', 'unknown')}\n"
                            f"# arch {labels['org.train.arch']}\n")
        return build, f"label org.train.arch={labels['org.train.arch']}"
    lock = labels.get("org.train.lock", "")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+\.txt", lock):
        return None, ""
    try:
        text = (containers_dir() / "requirements" / lock).read_text(errors="replace")
    except (OSError, UsageError):
        return None, f"lock {lock} (not found in this checkout)"
    return read_header(text), f"lock {lock}"


def check_arch(nodes: list[NodeType], named: bool, chosen: str,
                facts: ImageFacts | None) -> Check:
    """Each GPU type of the job's nodes against the architectures the image carries: a
    V100 (sm_70) on the CUDA 13 image fails at its first kernel, after the queue wait."""
    if chosen == "none":
        return Check(ARCH, None, "runtime none: the nodes' own torch (`train run --device "
                     "cuda` compares it with the GPU at start)")
    if facts is None:
        return Check(ARCH, None, f"the image was not opened (see {IMAGE})")
    build, source = image_arch(facts)
    if build is None:
        return Check(ARCH, None, "the image records no GPU architectures" +
                     (f" ({source})" if source else " (labels org.train.arch or "
                      "org.train.lock)"))
    if build.cuda is None and not build.arch_list:
        return Check(ARCH, None, f"a CPU build ({source}): see {CUDA}")
    served: list[str] = []
    unserved: list[str] = []
    no_linalg: list[str] = []
    for node in nodes:
        for gpu in node.gpu_types:
            cap = capability(gpu)
            if cap is None:
                continue
            runs = arch_runs(cap, build.arch_list)
            named_gpu = f"{node.name} {gpu} (sm_{cap[0]}{cap[1]})"
            (served if runs else unserved).append(named_gpu)
            if runs and build.linalg is not None and not arch_runs(cap, build.linalg):
                no_linalg.append(named_gpu)
    arch = " ".join(build.arch_list)
    variants = ", ".join(VARIANTS)
    if not unserved and no_linalg:
        return Check(ARCH, True, f"{source} carries {arch}, but its linear algebra library "
                     f"(torch.linalg on CUDA) only {' '.join(build.linalg or ())}: none for "
                     f"{', '.join(no_linalg)}", "a job that uses torch.linalg needs another "
                     f"variant there (shipped locks: {variants})", warn=True)
    if not unserved:
        return Check(ARCH, True if served else None,
                     f"{source} carries {arch}" + (f"; serves {', '.join(served)}" if served
                                                   else "; no known GPU type to compare"))
    fix = ("use the image variant built for these GPUs (docs/images.md, \"GPUs, drivers and image "
           f"variants\"; shipped locks: {variants})" +
           (", or another partition" if served else ""))
    detail = f"{source} carries {arch}: no code for {', '.join(unserved)}"
    if named or not served:
        return Check(ARCH, False, detail, fix)
    return Check(ARCH, True, f"{detail}; avoid those nodes", fix, warn=True)


def _driver_major(version: str) -> int:
    return int(version.split(".", maxsplit=1)[0])


def _check_cuda(profile: Profile, nodes: list[NodeType], named: bool, chosen: str,
                facts: ImageFacts | None) -> Check:
    if chosen == "none":
        return Check(CUDA, None, "runtime none: the nodes' own torch meets the driver (`train "
                     "run --device cuda` names a mismatch at start)")
    recorded = [n for n in nodes if n.driver_version]
    names = ", ".join(n.name for n in nodes)
    if not recorded:
        return Check(CUDA, None, f"{profile.name} records no NVIDIA driver for {names} (add "
                     "driver_version, from `nvidia-smi` on a node, to the node type in your "
                     "profile to have this checked)")
    if facts is None:
        return Check(CUDA, None, "the image's CUDA is not known: the image was not opened "
                     f"(see {IMAGE})")
    kind, version, source = image_cuda(facts)
    if kind == "unknown":
        return Check(CUDA, None, "the image records no CUDA version (labels org.train.lock "
                     "or org.train.base-image, or CUDA_VERSION in its environment)")
    gpu_nodes = [n for n in recorded if n.gpus_per_node > 0]
    if kind == "cpu" or version is None:
        if not gpu_nodes:
            return Check(CUDA, True, f"a CPU build ({source}) on nodes without GPUs")
        return Check(CUDA, False, f"the image is a CPU build ({source}): GPU jobs run "
                     f"--device cuda and stop at start on {', '.join(n.name for n in gpu_nodes)}",
                     "use the CUDA image: containers/base.def with its default "
                     "BASE_LOCK=base-cu130.txt (or --runtime none with a CUDA torch)")
    need = MIN_DRIVER.get(version[0])
    cuda = f"CUDA {version[0]}.{version[1]} ({source})"
    if need is None:
        return Check(CUDA, None, f"{cuda}: no minimum driver is known for CUDA {version[0]} "
                     "(train.common.cuda_check.MIN_DRIVER)")
    good = [n for n in recorded if _driver_major(n.driver_version or "0") >= need]
    bad = [n for n in recorded if n not in good]
    unrecorded = [n.name for n in nodes if not n.driver_version]
    have = ", ".join(f"{n.name} {n.driver_version}" for n in recorded)
    rest = f"; not recorded for {', '.join(unrecorded)}" if unrecorded else ""
    detail = f"{cuda} needs an NVIDIA driver >= {need}; {have}{rest}"
    if not bad:
        return Check(CUDA, True, detail)
    oldest = min(_driver_major(n.driver_version or "0") for n in bad)
    fits = max((major for major, minimum in MIN_DRIVER.items() if minimum <= oldest),
               default=None)
    rebuild = (f"build the image for CUDA {fits}.x, which driver {oldest} supports: "
               f"{variant_for_driver((fits, 9))}" if fits is not None else
               "ask the site about a newer driver")
    where = "--partition" if profile.partitions_allowed else "--constraint"
    suits = [n.name for n in (*profile.partitions.values(), *profile.constraints.values())
             if n.driver_version and _driver_major(n.driver_version) >= need]
    elsewhere = (f"run on {', '.join(suits)} ({where})" if suits else
                 f"run on nodes with a driver >= {need}")
    fix = f"{elsewhere}, or {rebuild}"
    if named or not good:
        return Check(CUDA, False, f"{detail}: too old on {', '.join(n.name for n in bad)}",
                     fix)
    return Check(CUDA, True, f"{detail}: avoid {', '.join(n.name for n in bad)} (driver too "
                 "old)", fix, warn=True)
