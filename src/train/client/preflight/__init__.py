"""Preflight on the login node (`train doctor --preflight`): will a job of this profile start?

Five checks, each saying how to fix what fails: the container runtime is there (and new
enough), the image opens, the account is one of the user's (the site's own command from the
profile, else sacctmgr), the runs root is writable and on a file system the compute nodes
share, and the image's CUDA build suits the nodes' NVIDIA driver where the profile records it.
A check that cannot know says so (SKIP) and never fails on not knowing; a warning (WARN) is a
pass with a fix. Every outside command goes through `run` (default: `run_command`, which runs
it in a process group of its own and kills the whole group when it times out) with a
timeout, found on `environ`'s PATH; the mount table is read from `mounts`: tests inject all.
Bad input (an unknown runtime, partition or constraint, an unusable account name or path)
raises ConfigError naming the field; everything else is a check's result.

The checks live by family: container (1), image (2), account (3), storage and runs_root (4),
gpu (5 and 6); result holds Check and how checks are shown, commands how outside commands
run, suite the order. The names importers use (`train doctor --preflight`, `train submit`)
are re-exported here.
"""

from __future__ import annotations

from train.client.preflight.account import listed_accounts
from train.client.preflight.commands import Runner, run_command
from train.client.preflight.container import MIN_APPTAINER, RUNTIMES
from train.client.preflight.gpu import check_arch, image_arch, image_cuda
from train.client.preflight.image import (
    ImageFacts,
    _apptainer_facts,
    check_image_file,
    image_facts,
    open_image,
)
from train.client.preflight.result import (
    ACCOUNT,
    ARCH,
    CUDA,
    IMAGE,
    RUNS_ROOT,
    RUNTIME,
    Check,
    checks_json,
    failed,
    format_checks,
)
from train.client.preflight.storage import (
    LOCAL_FS,
    MOUNTS,
    SHARED_FS,
    SHARED_FUSE,
    TEMP_DIRS,
    VOLATILE_FS,
    Mount,
    _under,
    _unescape,
    mount_of,
    read_mounts,
)
from train.client.preflight.suite import run_preflight

# (_apptainer_facts, _under, _unescape: helpers the tests reach through the package)
__all__ = [
    "ACCOUNT", "ARCH", "CUDA", "IMAGE", "LOCAL_FS", "MIN_APPTAINER", "MOUNTS", "RUNS_ROOT",
    "RUNTIME", "RUNTIMES", "SHARED_FS", "SHARED_FUSE", "TEMP_DIRS", "VOLATILE_FS", "Check",
    "ImageFacts", "Mount", "Runner", "_apptainer_facts", "_under", "_unescape", "check_arch",
    "check_image_file", "checks_json", "failed", "format_checks", "image_arch", "image_cuda",
    "image_facts", "listed_accounts", "mount_of", "open_image", "read_mounts", "run_command",
    "run_preflight",
]
