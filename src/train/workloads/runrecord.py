"""A run folder's record of the run it holds (config.json), and whether a run with other
settings may continue there: `train run` checks it on the node, and `train submit` on the
login node before anything is queued (no torch here), with the same rule and words."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from train.batch import contract
from train.common.errors import ConfigError
from train.common.yamlio import shown
from train.workloads.config import RunConfig

RECORD_LIMIT = 16 * 2**20  # config.json read back to compare a resumed run's settings


def read_run_record(cfg: RunConfig) -> dict[str, Any]:
    """The run record in cfg's folder ({} where there is none)."""
    record = cfg.out_dir / "config.json"
    if not os.path.lexists(record):
        return {}
    try:
        if not stat.S_ISREG(record.lstat().st_mode):
            raise TypeError("not a regular file")
        with open(record, "rb") as fh:  # a run record is a few KiB
            text = fh.read(RECORD_LIMIT + 1)
        if len(text) > RECORD_LIMIT:
            raise ValueError(f"over {RECORD_LIMIT // 2**20} MiB")
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError("not a mapping")
        if not isinstance(data["config"], dict):
            raise TypeError("config is not a mapping")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ConfigError("out", f"{record} is not a readable run record ({exc}); use a new "
                          "--out, or remove it to start over there") from None
    return data


def differences(cfg: RunConfig, data: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The identity settings in which cfg differs from the recorded run ({name: (recorded,
    now)}); none where nothing was trained there yet."""
    if not data or not trained_before(cfg):  # an attempt that stopped before training
        return {}                             # pins nothing
    recorded = data["config"]
    exempt = {"batch_size"} if batch_fallback(cfg, data) else set()
    return {k: (recorded[k], v) for k, v in cfg.identity().items()
            if k in recorded and recorded[k] != v and k not in exempt}


def batch_fallback(cfg: RunConfig, record: dict[str, Any]) -> bool:
    """The run goes on with either batch size: `train launch`'s GPU memory wait fell back to
    a smaller one, in this chunk or (the record says) an earlier one."""
    return contract.batch_fallback(cfg.batch_size) or bool(record.get("batch_fallback"))


def describe(differ: dict[str, tuple[Any, Any]]) -> str:
    """'res: the run has 32, now 16; seeds: ...', in field order by name."""
    return "; ".join(f"{k}: the run has {shown(old)}, now {shown(new)}"
                     for k, (old, new) in sorted(differ.items()))


def check_same_run(cfg: RunConfig) -> dict[str, Any]:
    """A run folder's run (config.json) continues only with its identity settings, finished
    runs included: else exit 2 naming every field that differs. Returns the record."""
    data = read_run_record(cfg)
    differ = differences(cfg, data)
    if differ:
        raise ConfigError(sorted(differ)[0], f"differs from the run in {cfg.out_dir} "
                          f"({describe(differ)}); use its settings, or a new --out")
    return data


def trained_before(cfg: RunConfig) -> bool:
    """Some seed of this folder has a checkpoint or a summary: a run was trained here."""
    try:
        return any(p.name.startswith("seed_") and (
            (p / "summary.json").exists() or any((p / "checkpoints").glob("ckpt-*.pt")))
            for p in cfg.out_dir.iterdir())
    except OSError:
        return False
