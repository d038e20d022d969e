"""`train clusters probe NAME --write`: the probed values as a profile, each with a comment
naming the date and the command that gave it, written where the profile in force came from
(`target`); an earlier file's other keys kept, and the file itself kept first as a numbered
copy (NAME.yaml.1, .2, ...: never replaced). Nothing is guessed: a value no command could
read stays as the profile had it, and its comment says so."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from train.client.clusters.probe.site import (
    SACCTMGR_QOS,
    SCONTROL,
    SINFO,
    SINFO_FORMAT,
    Group,
    Site,
    _job_nodes,
)
from train.client.clusters.profiles import USER_DIR, Registry, folders, node_values
from train.client.clusters.schema import NodeType, Profile
from train.client.clusters.units import format_limit, format_mem
from train.common import yamlio
from train.common.errors import ConfigError
from train.common.safewrite import keep_copy, write_atomic

Tree = dict[str, Any]  # leaves: (value, comment)
_UNPROBED = ("max_gpus", "driver_version", "cpu_jobs", "multi_node_whole")  # read by no command


def _kept(data: Any, comment: str) -> Any:
    if isinstance(data, dict):
        return {str(k): _kept(v, comment) for k, v in data.items()}
    return (data, comment)


def _node_tree(node: NodeType | None, site: Group | None, *, limits: bool, said: str,
               kept: str, source: str) -> Tree:
    """A whole partition or constraint entry: probed values where the site answered."""
    values = {} if node is None else node_values(node)
    out: Tree = {k: (v, kept) for k, v in values.items() if k not in _UNPROBED}
    if site is not None:  # (over the kept values, in their places)
        out.update({"gpus_per_node": (site.gpus, said + (" (its smallest node)"
                                                         if site.uneven else "")),
                    "gpu_types": (list(site.gpu_types), said), "cpus_per_node": (site.cpus, said),
                    "mem_per_node": (format_mem(site.mem_mb), said)})
    if limits and site is not None:
        why = "MaxNodes" if site.max_nodes is not None and site.max_nodes <= site.nodes \
            else f"no smaller MaxNodes than its {site.nodes} nodes"
        out["max_time"] = (format_limit(site.max_minutes), said)
        out["max_nodes"] = (_job_nodes(site), f"{said} ({why})")
    unprobed = kept if site is None else f"not probed: kept from {source}"
    out.update({k: (values[k], unprobed) for k in _UNPROBED  # (cpu_jobs even when false)
                if k in values and values[k] is not None
                and (values[k] is not False or k == "cpu_jobs")})
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
    head: Tree = {"name": (profile.name, f"{when}: train clusters probe {profile.name}")}
    if base is not None:
        head["extends"] = (base, "the values below replace that profile's")
    tree = {**head, **tree}
    if site.max_array_size:  # 0 (no job arrays) is no value a profile can hold
        tree["max_array_size"] = (site.max_array_size,
                                       f"{when}: {' '.join(SCONTROL)} (MaxArraySize)")
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
                section["default"] = (default, f"{sinfo} (the partition marked *)")
        if profile.constraints:
            tree["constraints"] = {
                feature: _node_tree(node, site.feature(feature), limits=False,
                                    said=f"{sinfo} (the nodes with this feature)", kept=kept,
                                    source=profile.source)
                for feature, node in profile.constraints.items()}
            for entry in tree["constraints"].values():  # a constraint's limits: not probed
                entry.setdefault("max_time", (None, kept))
    # (site.reservations are not written: a maintenance is dated, and a profile holds what
    # stays true of the site; submit and status read them from Slurm when they need them)
    if site.qos is not None and profile.qos_limits:
        section = tree.setdefault("qos", {})
        limits: Tree = {}
        for name, minutes in profile.qos_limits.items():
            if name in site.qos:
                limits[name] = (format_limit(site.qos[name]), f"{when}: {' '.join(SACCTMGR_QOS)}")
            else:
                limits[name] = (format_limit(minutes),
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
            value, comment = item  # one line: a path may hold a line break
            comment = " ".join(str(comment).split())
            lines.append(f"{pad}{label}: {_scalar(value)}  # {comment}")
    return lines


def target(profile: Profile) -> Path:
    """Where --write writes: the file the profile in force came from (the user's folder,
    $TRAIN_CLUSTERS_PATH, --profile), or for a shipped profile the user's NAME.yaml."""
    if profile.source.startswith("package:"):
        return USER_DIR.expanduser() / f"{profile.name}.yaml"
    return Path(profile.source).resolve()  # a link: the file it names is written


def _check(path: Path, extra_files: Iterable[Path],
           environ: Mapping[str, str] | None) -> None:
    """The profiles as they are now, with `path` among them, must load."""
    extra = list(extra_files)
    seen = {Path(p).resolve() for p in extra} | {
        (f / path.name).resolve() for f in folders(environ) if (f / path.name).exists()}
    Registry(extra if path.resolve() in seen else [*extra, path], environ)


def write_profile(profile: Profile, site: Site, path: Path, when: str | None = None, *,
                  extra_files: Iterable[Path] = (),
                  environ: Mapping[str, str] | None = None) -> Path | None:
    """Write the probed profile to `path` (an earlier file there: its other keys kept, the
    file itself kept first as a numbered copy). Returns the kept copy's path, if any;
    `path` itself where the file holds these values already (left as it is, its dates
    too: no copy of an identical profile).
    Checked as a profile (among those of `extra_files` and `environ`'s search path) before
    it replaces anything; a file that does not load leaves the earlier one in place."""
    stamp = when or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    earlier: dict[str, Any] = {}
    if path.exists() or path.is_symlink():
        loaded = yamlio.load_file(path, "--write")
        if not isinstance(loaded, dict) or loaded.get("name") != profile.name:
            raise ConfigError("--write", f"{path} holds another profile than "
                              f"{profile.name!r}; move it aside and probe again")
        earlier = loaded
    tree = probed_tree(profile, site, earlier, stamp, path.name)
    text = "\n".join([f"# written by `train clusters probe {profile.name} --write` on "
                      f"{stamp}: each value's comment names the command that gave it",
                      *emit(tree)]) + "\n"
    if earlier and yamlio.load_text(text, str(path), "--write") == earlier:
        return path  # the same values (the dates in its comments aside): no copy, no write
    kept: list[Path] = []

    def loads_then_keep(pending: Path) -> None:
        try:
            yamlio.load_file(pending, "profile")
        except ConfigError as exc:
            raise ConfigError("--write", f"the probed values do not make a profile, so "
                              f"{path} was not written: {exc}") from None
        if earlier:
            kept.append(keep_copy(path))

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text, before=loads_then_keep)
    except OSError as exc:
        for copy in kept:  # the earlier file is still in place: its copy is no copy
            copy.unlink(missing_ok=True)
        raise ConfigError("--write", f"cannot write {path}: {exc.strerror or exc}; nothing "
                          "was changed") from None
    try:
        _check(path, extra_files, environ)
    except ConfigError as exc:
        if kept:
            write_atomic(path, kept[0].read_bytes())
            kept[0].unlink()  # the earlier file is back in its place
        else:
            path.unlink()
        raise ConfigError("--write", f"with the probed values, the profiles do not load "
                          f"({exc}), so {path} is as it was") from None
    return kept[0] if kept else None
