"""The probe's comparison: each value where the profile and the site differ ("profile says
X, the site says Y"), and the site's facts that no profile key holds."""

from __future__ import annotations

import time
from collections.abc import Sequence

from train.client.clusters.probe.site import Group, Site, _job_nodes
from train.client.clusters.schema import NodeType, Profile
from train.client.clusters.units import format_mem, format_time
from train.client.slurm.reservations import ahead


def _time(minutes: int | None) -> str:
    return "no limit" if minutes is None else format_time(minutes)


def _types(types: Sequence[str]) -> str:
    return "[" + ", ".join(types) + "]"


def _node_lines(where: str, node: NodeType, site: Group, *,
                limits: bool) -> list[str]:
    said = [("gpus_per_node", str(node.gpus_per_node), str(site.gpus)),
            ("gpu_types", _types(sorted(node.gpu_types)), _types(site.gpu_types)),
            ("cpus_per_node", str(node.cpus_per_node), str(site.cpus)),
            ("mem_per_node", format_mem(node.mem_mb), format_mem(site.mem_mb))]
    if limits:
        said += [("max_time", _time(node.max_minutes), _time(site.max_minutes)),
                 ("max_nodes", str(node.max_nodes), str(_job_nodes(site)))]
    return [f"{where}.{key}: profile says {mine}, the site says {theirs}"
            for key, mine, theirs in said if mine != theirs]


def differences(profile: Profile, site: Site) -> list[str]:
    """'profile says X, the site says Y', one line a value (nothing for what the site did
    not answer)."""
    lines: list[str] = []
    if site.nodes:
        parts = site.partitions()
        for name, node in profile.partitions.items():
            if name not in parts:
                lines.append(f"partitions.{name}: profile lists it, the site's sinfo shows "
                             "no such partition (or none you may use)")
                continue
            lines += _node_lines(f"partitions.{name}", node, parts[name], limits=True)
        if profile.partitions_allowed:
            for name, part in parts.items():
                if name not in profile.partitions:
                    lines.append(f"partitions.{name}: profile does not list it, the site has "
                                 f"it ({part.nodes} nodes, {part.gpus} GPUs "
                                 f"{_types(part.gpu_types)}, {part.cpus} CPUs, "
                                 f"{format_mem(part.mem_mb)} each, max_time "
                                 f"{_time(part.max_minutes)})")
        default = site.default_partition()
        if profile.partitions_allowed and default != profile.default_partition:
            lines.append(f"partition.default: profile says {profile.default_partition}, the "
                         f"site says {default}")
        for feature, node in profile.constraints.items():
            found = site.feature(feature)
            if found is None:
                lines.append(f"constraints.{feature}: profile lists it, no node of the site "
                             "has that feature")
                continue
            lines += _node_lines(f"constraints.{feature}", node, found, limits=False)
    size = site.max_array_size
    if size is not None and size != profile.max_array_size:
        lines.append(f"max_array_size: profile says {profile.max_array_size}, the site says "
                     f"{size} (MaxArraySize)" + (": the site allows no job arrays, which no "
                                                 "profile value can say" if size == 0 else ""))
    if site.qos is not None:
        for name, minutes in profile.qos_limits.items():
            if name not in site.qos:
                lines.append(f"qos.limits.{name}: profile lists it, the site has no such QOS")
            elif site.qos[name] != minutes:
                lines.append(f"qos.limits.{name}: profile says {_time(minutes)}, the site "
                             f"says {_time(site.qos[name])}")
    return lines


def facts(site: Site) -> list[str]:
    """What the site says that no profile key holds."""
    lines = [f"{k} = {v}  (scontrol show config)" for k, v in site.config.items()]
    if site.apptainer:
        lines.append(f"{site.apptainer}  (apptainer --version): on PATH without modules, so "
                     "a job skips the profile's `modules:` lines")
    else:
        lines.append("apptainer is not on PATH here: a job runs the profile's `modules:` "
                     "lines (module load apptainer) to find it")
    for name, part in (site.partitions() if site.nodes else {}).items():
        default = " (the default)" if name == site.default_partition() else ""
        lines.append(f"partition {name}{default}: {part.nodes} nodes, {part.cpus} CPUs, "
                     f"{format_mem(part.mem_mb)}, {part.gpus} GPUs {_types(part.gpu_types)} "
                     f"each; max_time {_time(part.max_minutes)}, at most {_job_nodes(part)} "
                     "nodes a job  (sinfo)")
        if part.features:
            lines.append(f"partition {name}: node features {', '.join(part.features)}")
        if part.uneven:
            lines.append(f"partition {name}: its nodes differ; the smallest is shown")
    if site.qos:
        lines.append("QOS time limits (sacctmgr show qos): " + ", ".join(
            f"{name} {_time(minutes)}" for name, minutes in site.qos.items()))
    if site.associations:
        lines.append("your associations (Account|Partition|QOS): "
                     + "; ".join(site.associations))
    if site.reservations is not None:
        now = time.time()
        maint = ahead(site.reservations, now, float("inf"))
        lines += [f"maintenance: {r.words(now)}  (scontrol show reservation)"
                  for r in maint] or ["maintenance: none ahead  (scontrol show reservation)"]
    return lines
