"""`train clusters probe NAME --write`: the probed values as a user profile (`extends:
NAME`), each with a comment naming the date and the command that gave it; an earlier file's
other keys kept, and the file itself kept as NAME.yaml.before-probe."""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from train.client.clusters.probe.site import (
    SACCTMGR_QOS,
    SINFO,
    SINFO_FORMAT,
    Group,
    Site,
    _job_nodes,
)
from train.client.clusters.profiles import (
    USER_DIR,
    NodeType,
    Profile,
    Registry,
    format_mem,
    format_time,
)
from train.common import yamlio
from train.common.errors import ConfigError

Tree = dict[str, Any]  # leaves: (value, comment)


def _leaf(value: Any, comment: str) -> tuple[Any, str]:
    return (value, comment)


def _kept(data: Any, comment: str) -> Any:
    if isinstance(data, dict):
        return {str(k): _kept(v, comment) for k, v in data.items()}
    return _leaf(data, comment)


def _node_tree(node: NodeType | None, site: Group | None, *, limits: bool, said: str,
               kept: str, source: str) -> Tree:
    """A whole partition or constraint entry: probed values where the site answered."""
    out: Tree = {}
    probed = site is not None

    def put(key: str, value: Any, old: Any) -> None:
        if probed:
            out[key] = _leaf(value, said)
        elif node is not None:
            out[key] = _leaf(old, kept)

    put("gpus_per_node", site.gpus if site else None, node.gpus_per_node if node else None)
    if site is not None and site.uneven:
        out["gpus_per_node"] = _leaf(site.gpus, said + " (its smallest node)")
    put("gpu_types", list(site.gpu_types) if site else None,
        list(node.gpu_types) if node else None)
    put("cpus_per_node", site.cpus if site else None, node.cpus_per_node if node else None)
    put("mem_per_node", format_mem(site.mem_mb) if site else None,
        format_mem(node.mem_mb) if node else None)
    if limits and site is not None:
        out["max_time"] = _leaf(None if site.max_minutes is None
                                else format_time(site.max_minutes), said)
        why = "MaxNodes" if site.max_nodes is not None and site.max_nodes <= site.nodes \
            else f"no smaller MaxNodes than its {site.nodes} nodes"
        out["max_nodes"] = _leaf(_job_nodes(site), f"{said} ({why})")
    elif node is not None:
        out["max_time"] = _leaf(None if node.max_minutes is None
                                else format_time(node.max_minutes), kept)
        out["max_nodes"] = _leaf(node.max_nodes, kept)
    if node is not None:  # no command reads these: policy, or the nodes' own driver
        unprobed = kept if site is None else f"not probed: kept from {source}"
        if node.max_gpus is not None:
            out["max_gpus"] = _leaf(node.max_gpus, unprobed)
        if node.driver_version is not None:
            out["driver_version"] = _leaf(node.driver_version, unprobed)
        out["cpu_jobs"] = _leaf(node.cpu_jobs, unprobed)
    return out


def probed_tree(profile: Profile, site: Site, earlier: Mapping[str, Any], when: str,
                earlier_name: str) -> Tree:
    """The written profile: the earlier file's keys (kept), then the probed values."""
    kept = f"kept from the profile ({profile.source}): not probed"
    sinfo = f"{when}: {' '.join(SINFO[:4])} '{SINFO_FORMAT}'"
    tree: Tree = {k: _kept(v, f"kept from the earlier {earlier_name}")
                  for k, v in earlier.items()
                  if k not in ("name", "extends", "partitions", "constraints")}
    # over the profile this file replaces: the shipped one, or what the earlier file extended
    base = earlier.get("extends") if earlier else profile.name
    head: Tree = {"name": _leaf(profile.name, f"{when}: train clusters probe {profile.name}")}
    if base is not None:
        head["extends"] = _leaf(base, "the values below replace that profile's")
    tree = {**head, **tree}
    if site.nodes:
        parts = site.partitions()
        if profile.partitions_allowed:
            entries: Tree = {}  # a partition sinfo does not show is left out
            for name in [*(p for p in profile.partitions if p in parts),
                         *(p for p in parts if p not in profile.partitions)]:
                entries[name] = _node_tree(profile.partitions.get(name), parts[name],
                                           limits=True, said=sinfo, source=profile.source,
                                           kept=kept)
            tree["partitions"] = entries
            default = site.default_partition()
            if default is not None:
                section = tree.setdefault("partition", {})
                section["default"] = _leaf(default, f"{sinfo} (the partition marked *)")
        if profile.constraints:
            tree["constraints"] = {
                feature: _node_tree(node, site.feature(feature), limits=False,
                                    said=f"{sinfo} (the nodes with this feature)", kept=kept,
                                    source=profile.source)
                for feature, node in profile.constraints.items()}
            for entry in tree["constraints"].values():  # a constraint's limits: not probed
                entry.setdefault("max_time", _leaf(None, kept))
    if site.qos is not None and profile.qos_limits:
        section = tree.setdefault("qos", {})
        limits: Tree = {}
        for name, minutes in profile.qos_limits.items():
            if name in site.qos:
                value = site.qos[name]
                limits[name] = _leaf(None if value is None else format_time(value),
                                     f"{when}: {' '.join(SACCTMGR_QOS)}")
            else:
                limits[name] = _leaf(None if minutes is None else format_time(minutes),
                                     "the site's sacctmgr does not list it: " + kept)
        section["limits"] = limits
    return tree


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)  # JSON is YAML, in flow style
    return json.dumps(str(value))


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_YAML_WORDS = ("true", "false", "yes", "no", "on", "off", "y", "n", "null")


def emit(tree: Tree, indent: int = 0) -> list[str]:
    lines = []
    pad = "  " * indent
    for key, item in tree.items():
        label = key if _PLAIN_KEY.fullmatch(key) and key.lower() not in _YAML_WORDS \
            else json.dumps(key)
        if isinstance(item, dict):
            if not item:
                lines.append(f"{pad}{label}: {{}}")
                continue
            lines.append(f"{pad}{label}:")
            lines += emit(item, indent + 1)
        else:
            value, comment = item
            lines.append(f"{pad}{label}: {_scalar(value)}  # {comment}")
    return lines


def target(name: str) -> Path:
    return USER_DIR.expanduser() / f"{name}.yaml"


def write_profile(profile: Profile, site: Site, path: Path,
                  when: str | None = None) -> Path | None:
    """Write the probed profile to `path` (an earlier file there: its other keys kept, the
    file itself kept as NAME.yaml.before-probe). Returns the kept copy's path, if any.
    Checked as a profile before it replaces anything."""
    stamp = when or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    earlier: dict[str, Any] = {}
    if path.exists():
        loaded = yamlio.load_file(path, "profile")
        if not isinstance(loaded, dict) or loaded.get("name") != profile.name:
            raise ConfigError("--write", f"{path} holds another profile than "
                              f"{profile.name!r}; move it aside and probe again")
        earlier = loaded
    tree = probed_tree(profile, site, earlier, stamp, path.name)
    text = "\n".join([f"# written by `train clusters probe {profile.name} --write` on "
                      f"{stamp}: each value's comment names the command that gave it",
                      *emit(tree)]) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    pending = path.with_name(f".{path.name}.{os.getpid()}")
    pending.write_text(text, encoding="utf-8")
    kept = path.with_name(path.name + ".before-probe") if path.exists() else None
    try:
        yamlio.load_file(pending, "profile")
        if kept is not None:
            kept.write_bytes(path.read_bytes())
        pending.replace(path)
        try:  # the profiles as they now are must load: else the earlier file goes back
            Registry([] if path.parent == USER_DIR.expanduser() else [path])
        except ConfigError:
            if kept is not None:
                kept.replace(path)
            else:
                path.unlink()
            raise
    finally:
        pending.unlink(missing_ok=True)
    return kept
