"""What the site's Slurm says, read on the login node (`read_site`): sinfo's partitions and
nodes, scontrol's configuration, sacctmgr's QOS limits and the user's associations, the
Apptainer version; the parsers of their output, and a partition's nodes as one Group (its
smallest node). A command that is missing or fails is noted in `Site.unread`."""

from __future__ import annotations

import getpass
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from train.client.clusters.profiles import parse_time
from train.common import _proc
from train.common.errors import ConfigError

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


def _job_nodes(site: Group) -> int:
    """The most nodes one job can have: the partition's limit, or all of its nodes."""
    return site.nodes if site.max_nodes is None else min(site.max_nodes, site.nodes)
