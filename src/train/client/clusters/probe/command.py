"""`train clusters probe NAME [--write]`: each value where the profile and the site differ
("profile says X, the site says Y"), the site's facts that no profile key holds, what is
printed, and the command itself."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from train.client.clusters.probe.site import TIMEOUT, Group, Site, _job_nodes, read_site
from train.client.clusters.probe.write import target, write_profile
from train.client.clusters.profiles import Registry
from train.client.clusters.schema import NodeType, Profile
from train.client.clusters.units import format_mem, format_time
from train.client.slurm.reservations import ahead
from train.common.errors import ResourceError, TrainError


def _time(minutes: int | None) -> str:
    return "no limit" if minutes is None else format_time(minutes)


def _types(types: Sequence[str]) -> str:
    return "[" + ", ".join(types) + "]"


def _node_lines(where: str, node: NodeType, site: Group | None, *, limits: bool,
                missing: str) -> list[str]:
    if site is None:
        return [f"{where}: profile lists it, {missing}"]
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
            lines += _node_lines(f"partitions.{name}", node, parts.get(name), limits=True,
                                 missing="the site's sinfo shows no such partition (or none "
                                 "you may use)")
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
            lines += _node_lines(f"constraints.{feature}", node, site.feature(feature),
                                 limits=False, missing="no node of the site has that feature")
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
    for name, part in site.partitions().items():
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


def report(profile: Profile, site: Site) -> list[str]:
    """What `train clusters probe` prints before any writing."""
    diffs = differences(profile, site)
    lines = [f"probe of {profile.name} (profile from {profile.source}), by this login "
             "node's Slurm:"]
    if site.nodes:
        lines.append(f"differences ({len(diffs)}):" if diffs else
                     "differences: none; the profile says what the site says")
        lines += [f"  {d}" for d in diffs]
    facts_ = facts(site)
    if facts_:
        lines.append("the site also says (no profile key holds these):")
        lines += [f"  {f}" for f in facts_]
    if site.unread:
        lines.append("could not read (the profile's values stay as they are):")
        lines += [f"  {u}" for u in site.unread]
    lines.append("not probed: the nodes' NVIDIA driver (driver_version): ask a node with "
                 "`srun --gres=gpu:1 nvidia-smi`")
    return lines


def probe(profile: Profile, *, write: bool, extra_files: Sequence[Path] = (),
          environ: Mapping[str, str] | None = None, timeout: float = TIMEOUT
          ) -> tuple[list[str], bool, TrainError | None]:
    """(lines to print, whether the site's partitions could be read, why --write wrote
    nothing): the report comes whatever --write then does."""
    site = read_site(environ, timeout=timeout)
    lines = report(profile, site)
    if not write:
        return lines, bool(site.nodes), None
    if not site.nodes:
        why = next((u for u in site.unread if u.startswith("partitions and nodes:")), "")
        return lines, False, ResourceError(
            f"clusters probe --write: nothing was written: sinfo could not be read ({why}), "
            "so there is nothing probed to write; run it on the cluster's login node")
    path = target(profile)
    try:
        kept = write_profile(profile, site, path, extra_files=extra_files, environ=environ)
    except TrainError as exc:
        return lines, True, exc
    if kept == path:  # (the file says this already: no copy of an identical file)
        lines.append(f"{path} holds these values already: left as it was")
        kept = None
    else:
        lines.append(f"wrote {path}" + (f" (the earlier file is kept as {kept})" if kept
                                        else ""))
    gone = [p for p in profile.partitions if p not in site.partitions()]
    if gone and profile.partitions_allowed:
        lines.append(f"left out: partitions {', '.join(gone)} (sinfo shows no such partition)"
                     + (f"; {kept} still lists them" if kept else ""))
    return lines + _closing(profile.name, path, site, extra_files, environ), True, None


def _closing(name: str, path: Path, site: Site, extra_files: Sequence[Path],
             environ: Mapping[str, str] | None) -> list[str]:
    """What the written profile now says against the site, and what to do about it."""
    now = Registry(extra_files, environ).get(name)
    left = differences(now, site)
    if not left:
        return [f"the profile {name} now says what the site says; check a job with "
                f"`train submit --cluster {name} ...` (Slurm is asked before anything is "
                "queued)"]
    if now.source.startswith("package:") or Path(now.source).resolve() != path.resolve():
        head = (f"the profile {name} in force comes from {now.source}, not from {path}; it "
                f"still differs ({len(left)}): move {now.source} aside, or probe it with "
                f"--profile {now.source} --write:")
    else:
        head = (f"{path} still differs from the site in {len(left)} value(s) that no command "
                "gave a value to write for (they stay as the profile had them); edit them if "
                "the site is right:")
    return [head, *(f"  {d}" for d in left)]
