"""Is CUDA usable here, and if not, why: a GPU job uses the GPU or stops with the cause.

Without this, `--device auto` on a node whose driver is too old for the image's torch
trained on the CPU and burnt the job's walltime. `check` is a pure rule over injected facts
and diagnoses only a failure (torch seeing the GPUs expected is usable, whatever else);
`gather_facts` reads torch and NVML (which answers where CUDA cannot initialise), lazily.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from train.common.gpus import arch_runs

# Why NVML gave no facts when its Python binding is absent (not a crash: a fact).
PYNVML_MISSING = "pynvml (the nvidia-ml-py package) is not installed"
# Oldest Linux driver per CUDA major version (only the major decides: driver_runs).
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
# CUDA_VISIBLE_DEVICES values that hide every GPU (Slurm writes NoDevFiles for a GRES
# without device files).
_HIDE_ALL = ("-1", "NoDevFiles")
_CPU_FIX = "To train on the CPU on purpose, pass --device cpu."


@dataclass(frozen=True)
class CudaFacts:
    torch_version: str  # torch.__version__
    torch_cuda: str | None  # torch.version.cuda: the CUDA torch was built for; None: CPU build
    torch_available: bool  # torch.cuda.is_available()
    torch_devices: int  # torch.cuda.device_count()
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES; None when unset
    driver_cuda: int | None  # nvmlSystemGetCudaDriverVersion_v2(), e.g. 12040; None: no NVML
    driver_version: str | None = None  # nvmlSystemGetDriverVersion(), e.g. "550.54.15"
    nvml_gpus: int | None = None  # nvmlDeviceGetCount()
    nvml_error: str | None = None  # why NVML gave no facts (PYNVML_MISSING, NVMLError text)
    mig: bool = False  # a GPU NVML sees is in MIG mode (CUDA then shows fewer devices)
    torch_error: str | None = None  # what torch warned while initialising CUDA
    slurm_job_id: str | None = None  # SLURM_JOB_ID
    slurm_gpus: str | None = None  # SLURM_GPUS_ON_NODE
    arch_list: tuple[str, ...] | None = None  # torch.cuda.get_arch_list(); None: unknown
    # each visible GPU: (name, compute capability), from torch; None: not read
    gpus: tuple[tuple[str, tuple[int, int]], ...] | None = None


def cuda_version(value: int) -> tuple[int, int]:
    """NVML/CUDA's integer encoding: 12040 -> (12, 4), 13000 -> (13, 0)."""
    return value // 1000, (value % 1000) // 10


def parse_version(text: str) -> tuple[int, int] | None:
    """torch.version.cuda "13.0" or "12.8" -> (13, 0), (12, 8); None when unreadable."""
    parts = text.strip().split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def visible_entries(visible: str | None) -> list[str] | None:
    """The devices CUDA_VISIBLE_DEVICES names, up to the first that hides the rest."""
    if visible is None:
        return None
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    return list(itertools.takewhile(lambda entry: entry not in _HIDE_ALL, entries))


def expected_devices(facts: CudaFacts) -> int | None:
    """How many CUDA devices this process should see: what CUDA_VISIBLE_DEVICES names, else
    what NVML counts; at least one (not all) where MIG slices are involved."""
    entries = visible_entries(facts.visible_devices)
    mig = facts.mig or any(e.startswith("MIG-") for e in entries or [])
    count = len(entries) if entries is not None else facts.nvml_gpus
    if count is None:
        return None
    return min(count, 1) if mig else count


def check(facts: CudaFacts, expected: int | None = None) -> str | None:
    """None when CUDA is usable, else a message that names the cause and the fix."""
    want = expected_devices(facts) if expected is None else expected
    if facts.torch_cuda is None:
        return _cpu_build(facts)
    if facts.torch_available and facts.torch_devices > 0:
        unserved = unserved_gpus(facts)
        if unserved:
            return _no_kernel_image(facts, unserved)
        if want is not None and facts.torch_devices < want:
            return _fewer_devices(facts, want)
        return None
    entries = visible_entries(facts.visible_devices)
    if entries is not None and not entries:
        return _none_visible(f"CUDA_VISIBLE_DEVICES={facts.visible_devices!r} hides every GPU")
    slurm_none = None
    if facts.slurm_job_id and entries is None and facts.slurm_gpus in (None, "", "0"):
        gpus = "unset" if facts.slurm_gpus in (None, "") else repr(facts.slurm_gpus)
        slurm_none = (f"SLURM job {facts.slurm_job_id} was given no GPU (SLURM_GPUS_ON_NODE "
                      f"{gpus}, CUDA_VISIBLE_DEVICES unset)")
    if facts.driver_cuda is None:  # NVML says nothing: a job without GPUs, or no driver
        return _none_visible(slurm_none) if slurm_none else _no_driver(facts)
    built = parse_version(facts.torch_cuda)
    if built is not None and not driver_runs(cuda_version(facts.driver_cuda), built):
        return _driver_too_old(facts, built)
    if slurm_none:
        return _none_visible(slurm_none)
    if facts.nvml_gpus == 0:
        driver = f" {facts.driver_version}" if facts.driver_version else ""
        return _none_visible(f"the NVIDIA driver{driver} is loaded but NVML sees no GPU")
    return _fewer_devices(facts, max(1, want or 0))


def driver_runs(driver: tuple[int, int], built: tuple[int, int]) -> bool:
    """Does a driver that supports CUDA `driver` run code built for CUDA `built`? The same
    major is enough from CUDA 11 on (minor-version compatibility: a cu128 torch runs on
    driver 535, which reports CUDA 12.2); before, the minor too."""
    if built[0] >= 11:
        return driver[0] >= built[0]
    return driver >= built


def unserved_gpus(facts: CudaFacts) -> list[tuple[str, tuple[int, int]]]:
    """The visible GPUs this torch build carries no code for (empty when unknown)."""
    if not facts.arch_list or not facts.gpus:
        return []
    return [(name, cap) for name, cap in facts.gpus if not arch_runs(cap, facts.arch_list)]


def _torch(facts: CudaFacts) -> str:
    return f"torch {facts.torch_version}"


def _said(facts: CudaFacts) -> str:
    return f" torch said: {facts.torch_error.rstrip('.')}." if facts.torch_error else ""


def _cpu_build(facts: CudaFacts) -> str:
    return (f"CUDA is unusable: {_torch(facts)} is a CPU-only build (torch.version.cuda is "
            "None), so it cannot use any GPU. Fix: run in the CUDA image (containers/"
            "base.def with its default BASE_LOCK=base-cu130.txt) or install a CUDA build of "
            f"torch in this environment. {_CPU_FIX}")


def _no_driver(facts: CudaFacts) -> str:
    error = facts.nvml_error or "unknown error"
    if error == PYNVML_MISSING:
        return (f"CUDA is unusable: {_torch(facts)} (built for CUDA {facts.torch_cuda}) "
                f"sees no GPU, and the driver cannot be inspected: {PYNVML_MISSING}.{_said(facts)}"
                " Fix: install nvidia-ml-py to have the cause named; check that `nvidia-smi` "
                "works here and that the container got the GPUs (apptainer exec --nv, docker "
                f"run --gpus all). {_CPU_FIX}")
    hint = ""
    if "mismatch" in error.lower():
        hint = (" The kernel module and the driver's libraries differ (a driver update "
                "without a reboot): use another node and tell the site's admins.")
    return (f"CUDA is unusable: no NVIDIA driver is reachable: NVML cannot initialise "
            f"({error}).{_said(facts)}{hint} Fix: run on a GPU node (a GPU partition, with "
            "GPUs requested: --gpus-per-node or --gres=gpu:N), and pass the GPUs into the "
            "container: apptainer exec --nv, docker run --gpus all (`train submit` adds them "
            f"when the job has GPUs). {_CPU_FIX}")


def _driver_too_old(facts: CudaFacts, built: tuple[int, int]) -> str:
    assert facts.driver_cuda is not None
    have = cuda_version(facts.driver_cuda)
    need = MIN_DRIVER.get(built[0])
    need_text = f" (needs an NVIDIA driver >= {need})" if need else ""
    driver = facts.driver_version or "of unknown version"
    return (f"CUDA is unusable: the NVIDIA driver is too old for this torch: driver {driver} "
            f"supports CUDA up to {have[0]}.{have[1]}, but {_torch(facts)} was built for "
            f"CUDA {facts.torch_cuda}{need_text}.{_said(facts)} Fix: use an image built for "
            f"this driver: {variant_for_driver(have)}, or run on nodes whose "
            f"driver is {'>= ' + str(need) if need else 'newer'} (`nvidia-smi` shows a node's "
            f"driver). {_CPU_FIX}")


# The shipped base image variants: lock file -> (CUDA it is built for, base image). Their
# architecture lists are recorded in each lock's header (docs/images.md, "GPUs, drivers and image
# variants").
VARIANTS = {
    "base-cu130.txt": ((13, 0), "nvidia/cuda:13.0.0-runtime-ubuntu24.04"),
    "base-cu128.txt": ((12, 8), "nvidia/cuda:12.8.1-runtime-ubuntu24.04"),
}


def variant_for_driver(have: tuple[int, int]) -> str:
    """The shipped variant a driver supporting CUDA `have` runs, as build arguments; or what
    to build where none fits."""
    fits = [(cuda, lock, base) for lock, (cuda, base) in VARIANTS.items()
            if driver_runs(have, cuda)]
    if fits:
        cuda, lock, base = max(fits)
        return (f"the CUDA {cuda[0]}.{cuda[1]} variant (containers/base.def with "
                f"--build-arg BASE_LOCK={lock} --build-arg BASE_IMAGE={base})")
    return (f"no shipped variant runs on a driver for CUDA {have[0]}.{have[1]}: build "
            f"containers/base.def with a lock of a CUDA {have[0]}.x torch (BASE_LOCK) on an "
            f"nvidia/cuda:{have[0]}.x base (BASE_IMAGE)")


def _no_kernel_image(facts: CudaFacts, unserved: list[tuple[str, tuple[int, int]]]) -> str:
    gpus = ", ".join(sorted({f"{name} (sm_{cap[0]}{cap[1]})" for name, cap in unserved}))
    arch = " ".join(facts.arch_list or ())
    oldest = min(cap for _name, cap in unserved)
    hint = " needs a CUDA 12.x torch such as 2.10.0 (cu128: sm_70 and up), the cu128 variant: " \
        "BASE_LOCK=base-cu128.txt" if oldest < (7, 5) else ""
    return (f"CUDA is unusable: {_torch(facts)} (built for CUDA {facts.torch_cuda}) carries "
            f"no code for {gpus}: its architectures are {arch}, and machine code runs only on "
            "its own major at an equal or higher minor, so every kernel would fail with \"no "
            "kernel image is available\". Fix: use the image variant built for this GPU "
            f"(docs/images.md, \"GPUs, drivers and image variants\": compute capability "
            f"{oldest[0]}.{oldest[1]}{hint}), or run on a partition whose GPUs "
            f"this image serves. {_CPU_FIX}")


def _none_visible(why: str) -> str:
    return (f"CUDA is unusable: no GPU is visible to this process: {why}. Fix: request GPUs "
            "for the job (train submit --gpus-per-node N, sbatch --gres=gpu:N or --gpus-per-"
            "node N) and do not clear CUDA_VISIBLE_DEVICES; on a CPU node or partition, "
            f"--device cuda cannot work. {_CPU_FIX}")


def _fewer_devices(facts: CudaFacts, want: int) -> str:
    seen = []
    if facts.visible_devices is not None:
        seen.append(f"CUDA_VISIBLE_DEVICES={facts.visible_devices!r}")
    if facts.nvml_gpus is not None:
        seen.append(f"NVML sees {facts.nvml_gpus}")
    if facts.driver_cuda is not None:
        major, minor = cuda_version(facts.driver_cuda)
        seen.append(f"driver {facts.driver_version or '?'} supports CUDA {major}.{minor}")
    seen.append(f"{_torch(facts)} built for CUDA {facts.torch_cuda}")
    return (f"CUDA is unusable: torch sees fewer GPUs than expected: {facts.torch_devices} of "
            f"{want} ({', '.join(seen)}).{_said(facts)} Fix: make CUDA_VISIBLE_DEVICES name "
            "devices this node has (`nvidia-smi -L`; a container or cgroup may renumber them), "
            "and check that no GPU is in an error state (`nvidia-smi -q`: Xid or ECC errors, "
            f"a GPU off the bus); else use another node. {_CPU_FIX}")


def gather_facts(environ: Mapping[str, str] | None = None) -> CudaFacts:
    """The real facts; a missing driver or library is a fact for `check`, never raised."""
    env = os.environ if environ is None else environ
    import torch

    caught: list[warnings.WarningMessage] = []
    available = False
    devices = 0
    if torch.version.cuda is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            available = torch.cuda.is_available()
            devices = torch.cuda.device_count() if available else 0
    torch_error = " ".join(_torch_said(str(w.message)) for w in caught) or None
    arch_list, gpus = _torch_arch(torch, devices)
    driver_cuda, driver_version, nvml_gpus, mig, nvml_error = _nvml_facts()
    return CudaFacts(
        torch_version=str(torch.__version__),
        torch_cuda=torch.version.cuda,
        torch_available=available,
        torch_devices=devices,
        visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        driver_cuda=driver_cuda,
        driver_version=driver_version,
        nvml_gpus=nvml_gpus,
        nvml_error=nvml_error,
        mig=mig,
        torch_error=torch_error,
        slurm_job_id=env.get("SLURM_JOB_ID"),
        slurm_gpus=env.get("SLURM_GPUS_ON_NODE"),
        arch_list=arch_list,
        gpus=gpus,
    )


def _torch_arch(torch: Any, devices: int
                ) -> tuple[tuple[str, ...] | None, tuple[tuple[str, tuple[int, int]], ...] | None]:
    """torch's architecture list and each of the `devices` GPUs' name and capability
    (both read without running a kernel); None where torch cannot say or sees no GPU."""
    if devices == 0:
        return None, None
    try:
        arch = tuple(str(a) for a in torch.cuda.get_arch_list())
        gpus = []
        for index in range(devices):
            major, minor = torch.cuda.get_device_capability(index)
            gpus.append((str(torch.cuda.get_device_name(index)), (int(major), int(minor))))
    except (RuntimeError, AssertionError):
        return None, None
    return arch or None, tuple(gpus)


def _torch_said(warning: str) -> str:
    """torch's CUDA warning without its boilerplate (the download advice, the C++ source
    location) and at most 400 characters."""
    text = " ".join(warning.split("(Triggered internally", maxsplit=1)[0].split())
    text = text.split(" Please update your GPU driver")[0]
    return text if len(text) <= 400 else text[:397] + "..."


def _nvml_facts() -> tuple[int | None, str | None, int | None, bool, str | None]:
    try:
        import pynvml
    except ImportError:
        return None, None, None, False, PYNVML_MISSING
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, None, None, False, f"{type(exc).__name__}: {exc}"
    driver_cuda: int | None = None
    driver_version: str | None = None
    count: int | None = None
    mig = False
    error: str | None = None
    try:
        driver_cuda = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        version = pynvml.nvmlSystemGetDriverVersion()
        driver_version = version.decode() if isinstance(version, bytes) else str(version)
        count = int(pynvml.nvmlDeviceGetCount())
        mig = any(_mig_enabled(pynvml, i) for i in range(count))
    except pynvml.NVMLError as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return driver_cuda, driver_version, count, mig, error


def _mig_enabled(nvml: Any, index: int) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(index))
    except nvml.NVMLError:  # not a MIG-capable GPU
        return False
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)
