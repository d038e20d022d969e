"""NAVSIM as a job runs it, on the login node: the presets, the checks of the job's NAVSIM
options (the job spec calls them) and of its own Hydra overrides, and the data roots NAVSIM
reads on the node itself. Its training command is train.client.slurm.navsimstep's; the
node's side (the feature cache) train.workloads.navsim's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from train.batch.contract import NAVSIM_CACHE_SWITCHES, NAVSIM_SPLIT_OVERRIDE, override_key
from train.common.errors import ConfigError

NAVSIM_SCRIPT = "/opt/navsim/navsim/planning/script/run_training.py"  # navsim.def's checkout
# NAVSIM's usual training split (its scripts/training/*.sh at the pinned commit); the
# Hydra group `train_test_split` has no default there (`???`), so the job always passes one
NAVSIM_SPLIT = "navtrain"
# ddp: the job sets Lightning's strategy; none: the script's own config decides (forks such
# as a run_training_dense.py that hard-code one would clash with an override)
NAVSIM_STRATEGIES = ("ddp", "none")
NAVSIM_DATA_ROOT = "/data/navsim"  # navsim.def: dataset/, dataset/maps and exp/ under it
STRATEGY_OVERRIDE = "trainer.params.strategy"
# a Hydra config name: what train_test_split=NAME can select
_HYDRA_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def check_presets(split: str, script: str) -> None:
    """--navsim-split: a name Hydra can select from NAVSIM's train_test_split group;
    --navsim-script: an absolute path on one line (as the image sees it)."""
    if not _HYDRA_NAME_RE.match(split):
        raise ConfigError("navsim_split", f"{split!r} is not a split name (letters, digits, "
                          "'_', '.', '-'): one of NAVSIM's common/train_test_split/ configs, "
                          "e.g. navtrain")
    if not script.startswith("/") or any(c in script for c in "\n\r\0"):
        raise ConfigError("navsim_script", f"{script!r} must be an absolute path on one "
                          "line (the script as the image sees it, e.g. "
                          f"{NAVSIM_SCRIPT})")


def check_overrides(workload: Sequence[str], strategy: str) -> None:
    """The job's own Hydra overrides may not set what the job sets itself: the cache
    switches (the node sets them per chunk), the split and (unless --navsim-strategy none)
    the strategy."""
    for arg in workload:
        key = override_key(arg)
        if key in NAVSIM_CACHE_SWITCHES:
            raise ConfigError("workload", f"{arg!r}: the job computes NAVSIM's feature cache "
                              "once and then trains from it, setting force_cache_computation "
                              "and use_cache_without_dataset per chunk; give cache_path=DIR "
                              "for a cache folder of your own (to compute it again, remove "
                              "the folder and its .train-*.json files beside it)")
        if key == NAVSIM_SPLIT_OVERRIDE:
            raise ConfigError("workload", f"{arg!r}: the job passes the split itself; "
                              "give it with --navsim-split")
        if key == STRATEGY_OVERRIDE and strategy != "none":
            raise ConfigError("workload", f"{arg!r}: the job sets the strategy; give "
                              "--navsim-strategy none to leave it to your overrides or "
                              "the script")


def node_data_env(data: str) -> dict[str, str]:
    """Runtime none (NAVSIM on the node itself): the data roots NAVSIM reads, set from
    --data, where a container would see them under NAVSIM_DATA_ROOT."""
    root = os.path.abspath(data)
    return {"OPENSCENE_DATA_ROOT": f"{root}/dataset",
            "NUPLAN_MAPS_ROOT": f"{root}/dataset/maps",
            "NAVSIM_EXP_ROOT": f"{root}/exp"}
