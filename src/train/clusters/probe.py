"""`train clusters probe NAME`: what the site's Slurm says, against what the profile says.

Run on the login node. Reads
- `sinfo -N` (one line a node and partition): each partition's nodes, their CPUs,
  memory, GRES (count and types) and features, the partition's time limit and job size,
  and which partition is the default (the `*` of %P). The `-o` format, not `--json`: its
  fields are the same from Slurm 22.05 to 25.x, where the JSON's layout is not;
- `scontrol show config`: the Slurm version, PreemptMode, KillWait, EnforcePartLimits;
- `sacctmgr show qos` (each QOS's MaxWall) and the user's associations (accounts,
  partitions, QOS), where the site's accounting answers;
- `apptainer --version`.

Prints each difference as "profile says X, the site says Y", the site's facts the profile
has no field for, and what could not be read. With `--write`, writes a user profile
(`name: NAME`, `extends: NAME`, in ~/.config/train/clusters/, where the Registry finds it
and where it replaces NAME for every job) holding the probed values, each with a comment
saying the date and the command that gave it. Nothing is guessed: a value no command
could read stays as the profile had it, and the comment says so.

A partition whose nodes differ is described by its smallest node (CPUs, memory, GPUs): a
job that fits it fits every node; the GPU types are all the nodes' types.
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train import _proc, yamlio
from train.clusters.profiles import (
    USER_DIR,
    NodeType,
    Profile,
    Registry,
    format_mem,
    format_time,
    parse_time,
)
from train.errors import ConfigError

TIMEOUT = 60.0
SEP = "|"
SINFO_FORMAT = SEP.join(("%R", "%N", "%c", "%m", "%G", "%f", "%l", "%s", "%P"))
SINFO = ("sinfo", "-h", "-N", "-o", SINFO_FORMAT)
SCONTROL = ("scontrol", "show", "config")
SACCTMGR_QOS = ("sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxWall")
APPTAINER = ("apptainer", "--version")
CONFIG_KEYS = ("SLURM_VERSION", "PreemptMode", "PreemptType", "KillWait",
               "EnforcePartLimits")
# one GRES: name[:type]:count, then an optional (S:0-1) socket list; or name:type:count
_GRES_RE = re.compile(r"([A-Za-z0-9_]+)(?::([A-Za-z0-9_.-]+))?:([0-9]+)(?:\([^)]*\))?")
_UNLIMITED = ("infinite", "unlimited", "")


@dataclass(frozen=True)
class SiteNode:
    name: str
    partition: str
    cpus: int
    mem_mb: int
    gpus: int
    gpu_types: tuple[str, ...]
    features: tuple[str, ...]
    max_minutes: int | None  # the partition's time limit; None: unlimited
    max_nodes: int | None  # the partition's largest job, in nodes; None: unlimited
    default: bool  # the site's default partition


@dataclass(frozen=True)
class Group:
    """What a partition (or a node feature) offers: the smallest of its nodes."""

    name: str
    nodes: int
    cpus: int
    mem_mb: int
    gpus: int
    gpu_types: tuple[str, ...]
    features: tuple[str, ...]
    max_minutes: int | None
    max_nodes: int | None
    uneven: bool  # its nodes differ in CPUs, memory or GPUs


@dataclass
class Site:
    nodes: list[SiteNode] = field(default_factory=list)
    config: dict[str, str] = field(default_factory=dict)
    qos: dict[str, int | None] | None = None
    associations: list[str] | None = None
    apptainer: str | None = None
    unread: list[str] = field(default_factory=list)  # "what: why"

    def partitions(self) -> dict[str, Group]:
        names = dict.fromkeys(n.partition for n in self.nodes)
        return {p: group(p, [n for n in self.nodes if n.partition == p]) for p in names}

    def feature(self, name: str) -> Group | None:
        seen: dict[str, SiteNode] = {}
        for node in self.nodes:
            if name in node.features:
                seen.setdefault(node.name, node)
        return group(name, list(seen.values())) if seen else None

    def default_partition(self) -> str | None:
        return next((n.partition for n in self.nodes if n.default), None)


# -- pure parsers ---------------------------------------------------------------------
def parse_gres(text: str) -> tuple[int, tuple[str, ...]]:
    """A node's GRES as sinfo %G prints it -> (GPUs, their types). 'gpu:2',
    'gpu:a100:4(S:0-1)', 'gpu:a100:2,gpu:v100:2', '(null)'."""
    count, types = 0, []
    for match in _GRES_RE.finditer(text):
        name, kind, number = match.groups()
        if name != "gpu":
            continue
        count += int(number)
        if kind and kind not in types:
            types.append(kind)
    return count, tuple(types)


def _limit_minutes(text: str) -> int | None:
    value = text.strip()
    return None if value.lower() in _UNLIMITED else parse_time(value, "sinfo %l")


def _max_nodes(text: str) -> int | None:
    """sinfo %s, the job size in nodes: '1-infinite', '1-4', '2'."""
    top = text.strip().rpartition("-")[2]
    return None if top.lower() in _UNLIMITED else int(top)


def parse_sinfo(text: str) -> list[SiteNode]:
    """`sinfo -h -N -o SINFO_FORMAT` -> one SiteNode a line (a node in two partitions
    gives two)."""
    nodes = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(SEP)
        if len(parts) != 9:
            raise ValueError(f"sinfo line {number}: {len(parts)} fields, expected 9: "
                             f"{line[:120]!r}")
        part, name, cpus, mem, gres, feats, limit, size, shown_part = parts
        gpus, types = parse_gres(gres)
        features = tuple(f for f in feats.split(",") if f and f != "(null)")
        try:
            nodes.append(SiteNode(
                name=name, partition=part, cpus=int(cpus), mem_mb=int(mem.rstrip("+")),
                gpus=gpus, gpu_types=types, features=features,
                max_minutes=_limit_minutes(limit), max_nodes=_max_nodes(size),
                default=shown_part.endswith("*")))
        except (ValueError, ConfigError) as exc:
            raise ValueError(f"sinfo line {number}: {exc}: {line[:120]!r}") from None
    return nodes


def group(name: str, nodes: Sequence[SiteNode]) -> Group:
    types: list[str] = []
    feats: list[str] = []
    for n in nodes:
        types += [t for t in n.gpu_types if t not in types]
        feats += [f for f in n.features if f not in feats]
    node_names = {n.name for n in nodes}
    first = nodes[0]
    return Group(
        name=name, nodes=len(node_names), cpus=min(n.cpus for n in nodes),
        mem_mb=min(n.mem_mb for n in nodes), gpus=min(n.gpus for n in nodes),
        gpu_types=tuple(sorted(types)), features=tuple(sorted(feats)),
        max_minutes=first.max_minutes, max_nodes=first.max_nodes,
        uneven=len({(n.cpus, n.mem_mb, n.gpus) for n in nodes}) > 1)


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` -> {key: value} for CONFIG_KEYS."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in CONFIG_KEYS:
            out[key.strip()] = value.strip()
    return out


def parse_qos(text: str) -> dict[str, int | None]:
    """`sacctmgr -n -P show qos format=Name,MaxWall` -> {QOS: minutes, None: no limit}."""
    out: dict[str, int | None] = {}
    for line in text.splitlines():
        name, sep, wall = line.partition(SEP)
        if sep and name:
            out[name] = _limit_minutes(wall)
    return out


# -- asking the site ------------------------------------------------------------------
def _ask(argv: Sequence[str], site: Site, what: str,
         environ: Mapping[str, str] | None) -> str | None:
    path = (os.environ if environ is None else environ).get("PATH")
    if shutil.which(argv[0], path=path) is None:
        site.unread.append(f"{what}: {argv[0]} is not on PATH")
        return None
    try:
        proc = _proc.run(argv, check=False, timeout=TIMEOUT, env=environ)
    except _proc.ProcError as exc:  # it hung
        site.unread.append(f"{what}: {exc}")
        return None
    if proc.returncode != 0:
        why = " ".join(proc.stderr.split()) or f"exit status {proc.returncode}"
        site.unread.append(f"{what}: `{' '.join(argv)}` said: {why}")
        return None
    return proc.stdout


def read_site(environ: Mapping[str, str] | None = None) -> Site:
    site = Site()
    text = _ask(SINFO, site, "partitions and nodes", environ)
    if text is not None:
        try:
            site.nodes = parse_sinfo(text)
        except ValueError as exc:
            site.unread.append(f"partitions and nodes: {exc}")
    text = _ask(SCONTROL, site, "Slurm's configuration", environ)
    if text is not None:
        site.config = parse_config(text)
    text = _ask(SACCTMGR_QOS, site, "QOS limits", environ)
    if text is not None:
        site.qos = parse_qos(text)
    user = (environ or os.environ).get("USER") or getpass.getuser()
    argv = ("sacctmgr", "-n", "-P", "show", "associations", f"user={user}",
            "format=Account,Partition,QOS")
    text = _ask(argv, site, "your associations (accounts)", environ)
    if text is not None:
        site.associations = [line for line in text.splitlines() if line.strip()]
    text = _ask(APPTAINER, site, "Apptainer", environ)
    if text is not None:
        site.apptainer = text.strip()
    return site


# -- the comparison -------------------------------------------------------------------
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


def _job_nodes(site: Group) -> int:
    """The most nodes one job can have: the partition's limit, or all of its nodes."""
    return site.nodes if site.max_nodes is None else min(site.max_nodes, site.nodes)


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
        lines.append(f"{site.apptainer}  (apptainer --version)")
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
    return lines


# -- writing --------------------------------------------------------------------------
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


# -- the command ----------------------------------------------------------------------
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
          environ: Mapping[str, str] | None = None) -> tuple[list[str], bool]:
    """(lines to print, whether the site's partitions could be read)."""
    from train.errors import ResourceError

    site = read_site(environ)
    lines = report(profile, site)
    if not write:
        return lines, bool(site.nodes)
    if not site.nodes:
        raise ResourceError("clusters probe --write: sinfo could not be read, so there is "
                            "nothing probed to write; run it on the cluster's login node")
    path = target(profile.name)
    kept = write_profile(profile, site, path)
    lines.append(f"wrote {path}" + (f" (the earlier file is kept as {kept})" if kept else ""))
    gone = [p for p in profile.partitions if p not in site.partitions()]
    if gone and profile.partitions_allowed:
        lines.append(f"left out: partitions {', '.join(gone)} (sinfo shows no such partition)")
    now = Registry(extra_files).get(profile.name)
    left = differences(now, site)
    if left:
        lines.append(f"the profile {profile.name} in force comes from {now.source}, which "
                     f"still differs ({len(left)}); move it aside:")
        lines += [f"  {d}" for d in left]
    else:
        lines.append(f"the profile {profile.name} now says what the site says; check a job "
                     f"with `train submit --cluster {profile.name} ...` (Slurm is asked "
                     "before anything is queued)")
    return lines, True
