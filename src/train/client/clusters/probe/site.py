"""What the site's Slurm says, read on the login node (`read_site`), and the parsers of its
commands' output. A partition's nodes are one Group: its smallest node (a job that fits it
fits every node). A command that is missing, fails, hangs or prints what its parser refuses
is noted in `Site.unread` with a short tail of its own words."""

from __future__ import annotations

import getpass
import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from train.client.clusters.units import parse_time
from train.client.clusters.validate import NAME_CHARS, NAME_RE
from train.client.slurm.reservations import (
    SHOW,
    Reservation,
    parse_reservations,
    standard_times,
)
from train.common import _proc
from train.common.errors import ConfigError

TIMEOUT = 30.0  # seconds a site command may take (`train clusters probe --timeout`)
SLOW = 5.0  # seconds after which the wait is said on stderr (at most half the timeout)
SEP = "|"
SINFO_FORMAT = SEP.join(("%R", "%N", "%c", "%m", "%G", "%f", "%l", "%s", "%P"))
# `-o`, not `--json`: its fields are the same from Slurm 22.05 to 25.x, the JSON's layout not
SINFO = ("sinfo", "-h", "-N", "-o", SINFO_FORMAT)
SCONTROL = ("scontrol", "show", "config")
SACCTMGR_QOS = ("sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxWall")
APPTAINER = ("apptainer", "--version")
CONFIG_KEYS = ("SLURM_VERSION", "PreemptMode", "PreemptType", "KillWait",
               "EnforcePartLimits")
ARRAY_KEY = "MaxArraySize"  # held by the profile's max_array_size
MAX_ARRAY_SIZE = 4_000_001  # the most Slurm allows
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
    max_array_size: int | None = None  # MaxArraySize; 0: the site allows no job arrays
    associations: list[str] | None = None
    apptainer: str | None = None
    reservations: list[Reservation] | None = None  # scontrol show reservation
    unread: list[str] = field(default_factory=list)  # "what: why"

    def partitions(self) -> dict[str, Group]:
        names = dict.fromkeys(n.partition for n in self.nodes)
        return {p: group(p, [n for n in self.nodes if n.partition == p]) for p in names}

    def feature(self, name: str) -> Group | None:  # (group counts a node once)
        nodes = [n for n in self.nodes if name in n.features]
        return group(name, nodes) if nodes else None

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
        if len(number) > 6:  # no node holds a million GPUs: not a count a profile takes
            raise ValueError(f"GPU count {number[:30]!r} is not a number of GPUs")
        count += int(number)
        if kind and kind not in types:
            types.append(kind)
    return count, tuple(types)


def _limit_minutes(text: str, what: str) -> int | None:
    """A time limit as Slurm prints it ('infinite', '2-00:00:00'); `what` names the field."""
    value = text.strip()
    if value.lower() in _UNLIMITED:
        return None
    try:
        return parse_time(value, what)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def _max_nodes(text: str) -> int | None:
    """sinfo %s, the job size in nodes: '1-infinite', '1-4', '2'."""
    top = text.strip().rpartition("-")[2]
    return None if top.lower() in _UNLIMITED else _count(top, "sinfo %s (nodes)")


def _name(value: str, what: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise ValueError(f"{what} {value[:60]!r} is not a name a profile can hold: "
                         f"{NAME_CHARS}")
    return value


def _count(value: str, what: str, *, least: int = 0) -> int:
    if not value.isdigit() or len(value) > 12 or int(value) < least:
        raise ValueError(f"{what} {value[:30]!r} is not a whole number of at least {least}")
    return int(value)


def parse_sinfo(text: str) -> list[SiteNode]:
    """`sinfo -h -N -o SINFO_FORMAT` -> one SiteNode a line (a node in two partitions
    gives two); a ValueError names a line that does not make a profile's values."""
    nodes = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(SEP)
        if len(parts) != 9:
            raise ValueError(f"sinfo line {number}: {len(parts)} fields, expected 9: "
                             f"{line[:120]!r}")
        part, name, cpus, mem, gres, feats, limit, size, shown_part = parts
        features = tuple(f for f in feats.split(",") if f and f != "(null)")
        try:
            gpus, types = parse_gres(gres)
            nodes.append(SiteNode(
                name=name, partition=_name(part, "partition"),
                cpus=_count(cpus, "sinfo %c (CPUs)"),
                mem_mb=_count(mem.rstrip("+"), "sinfo %m (memory, MB)", least=1),
                gpus=gpus, gpu_types=tuple(_name(t, "GPU type") for t in types),
                features=features, max_minutes=_limit_minutes(limit, "sinfo %l"),
                max_nodes=_max_nodes(size), default=shown_part.endswith("*")))
        except ValueError as exc:
            raise ValueError(f"sinfo line {number}: {exc}: {line[:120]!r}") from None
    return nodes


def group(name: str, nodes: Sequence[SiteNode]) -> Group:
    first = nodes[0]
    return Group(
        name=name, nodes=len({n.name for n in nodes}), cpus=min(n.cpus for n in nodes),
        mem_mb=min(n.mem_mb for n in nodes), gpus=min(n.gpus for n in nodes),
        gpu_types=tuple(sorted({t for n in nodes for t in n.gpu_types})),
        features=tuple(sorted({f for n in nodes for f in n.features})),
        max_minutes=first.max_minutes, max_nodes=first.max_nodes,
        uneven=len({(n.cpus, n.mem_mb, n.gpus) for n in nodes}) > 1)


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` -> {key: value} for CONFIG_KEYS and ARRAY_KEY."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in (*CONFIG_KEYS, ARRAY_KEY):
            out[key.strip()] = value.strip()
    return out


def parse_array_size(text: str) -> int | None:
    """MaxArraySize from `scontrol show config` (None: not there)."""
    value = parse_config(text).get(ARRAY_KEY)
    if value is None:
        return None
    if not value.isdigit() or len(value) > 7 or int(value) > MAX_ARRAY_SIZE:
        raise ValueError(f"{ARRAY_KEY} = {value[:30]!r} is not a number from 0 to "
                         f"{MAX_ARRAY_SIZE}")
    return int(value)


def parse_qos(text: str) -> dict[str, int | None]:
    """`sacctmgr -n -P show qos format=Name,MaxWall` -> {QOS: minutes, None: no limit}."""
    out: dict[str, int | None] = {}
    for number, line in enumerate(text.splitlines(), 1):
        name, sep, wall = line.partition(SEP)
        if sep and name:
            try:
                out[name] = _limit_minutes(wall, "MaxWall")
            except ValueError as exc:
                raise ValueError(f"line {number}: {exc}") from None
    return out


Note = Callable[[str], None]
T = TypeVar("T")


def _say(text: str) -> None:
    print(f"train: {text}", file=sys.stderr, flush=True)


def _ask(argv: Sequence[str], site: Site, what: str, environ: Mapping[str, str] | None,
         timeout: float, note: Note, hung: set[str]) -> str | None:
    """What argv printed (without terminal escapes), or None with the reason in
    site.unread. A program in `hung` (it did not answer before) is not asked again."""
    path = (os.environ if environ is None else environ).get("PATH")
    if shutil.which(argv[0], path=path) is None:
        site.unread.append(f"{what}: {argv[0]} is not on PATH")
        return None
    if argv[0] in hung:
        site.unread.append(f"{what}: not asked ({argv[0]} did not answer just before)")
        return None
    shown = f"`{shlex.join(argv)}`"
    slow = min(SLOW, timeout / 2)
    try:
        proc = _proc.run_bounded(argv, timeout=timeout, env=environ, slow=(slow, lambda: note(
            f"{shown} has not answered in {slow:g} s; waiting at most {timeout:g} s")))
    except _proc.ProcError as exc:
        if exc.returncode == 124:
            hung.add(argv[0])
            note(f"{shown} did not answer in {timeout:g} s: killed it and its children")
            why = f"did not answer in {timeout:g} s (killed, with its children)"
        else:
            why = _proc.tail(exc.stderr)
        site.unread.append(f"{what}: {shown} {why}")
        return None
    if proc.returncode != 0:
        said = _proc.tail(proc.stderr) or _proc.tail(proc.stdout) or "nothing"
        site.unread.append(f"{what}: {shown} failed (exit status {proc.returncode}): {said}")
        return None
    return _proc.printable(proc.stdout)


def _parsed(site: Site, what: str, argv: Sequence[str], parse: Callable[[str], T],
            text: str) -> T | None:
    """parse(text); output its parser refuses is noted naming argv, and gives None."""
    try:
        return parse(text)
    except ValueError as exc:
        site.unread.append(f"{what}: `{shlex.join(argv)}` printed what the probe cannot "
                           f"read: {exc}")
        return None


def read_site(environ: Mapping[str, str] | None = None, *, timeout: float = TIMEOUT,
              note: Note = _say) -> Site:
    """Ask the site; `note(text)` says on stderr that a command is slow or was killed."""
    site = Site()
    hung: set[str] = set()

    def ask(argv: Sequence[str], what: str, parse: Callable[[str], T],
            env: Mapping[str, str] | None = environ) -> T | None:
        text = _ask(argv, site, what, env, timeout, note, hung)
        return None if text is None else _parsed(site, what, argv, parse, text)

    nodes = ask(SINFO, "partitions and nodes", parse_sinfo)
    if nodes == []:  # (no line at all; a line it refused is noted by _parsed)
        site.unread.append(f"partitions and nodes: `{shlex.join(SINFO)}` listed no node")
    site.nodes = nodes or []
    text = ask(SCONTROL, "Slurm's configuration", str)
    if text is not None:
        site.config = {k: v for k, v in parse_config(text).items() if k != ARRAY_KEY}
        site.max_array_size = _parsed(site, "job array size", SCONTROL, parse_array_size,
                                      text)
    site.reservations = ask(SHOW, "reservations", parse_reservations, standard_times(environ))
    site.qos = ask(SACCTMGR_QOS, "QOS limits", parse_qos)
    user = (environ or os.environ).get("USER") or getpass.getuser()
    argv = ("sacctmgr", "-n", "-P", "show", "associations", f"user={user}",
            "format=Account,Partition,QOS")
    site.associations = ask(argv, "your associations (accounts)",
                            lambda text: [line for line in text.splitlines() if line.strip()])
    site.apptainer = ask(APPTAINER, "Apptainer", str.strip)
    return site


def _job_nodes(site: Group) -> int:
    """The most nodes one job can have: the partition's limit, or all of its nodes."""
    return site.nodes if site.max_nodes is None else min(site.max_nodes, site.nodes)
