"""Where a job lands: the node type its partition or constraint gives (alternatives
merged to what every one of them has), and how the site is asked for its GPU type (a node
feature ANDed onto the constraint, a typed GRES, or nothing where the choice implies it).
"""

from __future__ import annotations

import re

from train.client.clusters.schema import NodeType, Profile
from train.client.slurm.jobspec import JobSpec
from train.common.errors import ConfigError

# A constraint a feature can be ANDed onto: no alternatives, brackets, groups or counts.
_AND_ONLY = re.compile(r"^[^|\[\]()*,]+$")
# alternatives of plain features only: what may go into Slurm's matching OR, [a|b]
_OR_LIST = re.compile(r"[A-Za-z0-9_.:-]+(?:\|[A-Za-z0-9_.:-]+)+")


def choose_node(spec: JobSpec, profile: Profile) -> tuple[NodeType, str | None]:
    if not profile.partitions_allowed:
        if spec.partition:
            raise ConfigError("partition", f"{profile.name} does not use partitions; request "
                              f"GPUs with --constraint (one of "
                              f"{', '.join(profile.constraints)}, alternatives with '|')")
        if not spec.constraint:
            raise ConfigError("constraint", f"{profile.name} needs a constraint instead of a "
                              f"partition: one of {', '.join(profile.constraints)}")
        names = _unbracketed(spec.constraint).split("|")
        unknown = [n for n in names if n not in profile.constraints]
        if unknown:
            raise ConfigError("constraint", f"unknown constraint {unknown[0]!r} on "
                              f"{profile.name}; known: {', '.join(profile.constraints)} "
                              "(alternatives as a|b, or [a|b] for one type on every node)")
        if spec.gpu_type is not None:
            # land only where the requested type is (with none, resolve lists the types)
            names = [n for n in names if spec.gpu_type in profile.constraints[n].gpu_types] \
                or names
        nodes = [profile.constraints[n] for n in names]
        # the job must fit on every alternative it may land on
        merged = NodeType(
            name="|".join(names),
            gpus_per_node=min(n.gpus_per_node for n in nodes),
            gpu_types=tuple(t for n in nodes for t in n.gpu_types),
            cpus_per_node=min(n.cpus_per_node for n in nodes),
            mem_mb=min(n.mem_mb for n in nodes),
            **{bound: min((getattr(n, bound) for n in nodes if getattr(n, bound) is not None),
                          default=None) for bound in ("max_minutes", "max_nodes", "max_gpus")},
            cpu_jobs=all(n.cpu_jobs for n in nodes),
            multi_node_whole=any(n.multi_node_whole for n in nodes),
        )
        return merged, None
    partition = spec.partition or profile.default_partition
    if partition is None:
        raise ConfigError("partition", f"{profile.name} requires a partition; one of "
                          f"{', '.join(profile.partitions)}")
    if partition not in profile.partitions:
        raise ConfigError("partition", f"unknown partition {partition!r} on {profile.name}; "
                          f"known: {', '.join(profile.partitions)}")
    return profile.partitions[partition], partition


def _unbracketed(constraint: str) -> str:
    """[a|b] (Slurm's matching OR) without its brackets."""
    if len(constraint) > 2 and constraint[0] == "[" and constraint[-1] == "]":
        return constraint[1:-1]
    return constraint


def one_type_for_all(spec: JobSpec, constraint: str | None) -> str | None:
    """Alternatives as Slurm's matching OR where the job has several nodes: with `a|b`
    each node may match a different alternative (a DDP job on L40S and H200 nodes at once,
    run at the slower one's pace), `[a|b]` makes every node match the same one. Other
    expressions with '|' (with '&', counts or groups) are refused."""
    if constraint is None or "|" not in constraint or _unbracketed(constraint) != constraint:
        return constraint
    if spec.nodes == 1 and _unbracketed(spec.constraint or "") == (spec.constraint or ""):
        return constraint
    if _OR_LIST.fullmatch(constraint):
        return f"[{constraint}]"
    raise ConfigError("constraint", f"{constraint!r} on {spec.nodes} nodes: Slurm may give "
                      f"each node a different alternative; give one type for every node "
                      f"with the matching OR [a|b] (alternatives only), or one alternative")


def gpu_type_request(spec: JobSpec, profile: Profile, node: NodeType,
                      partition: str | None) -> tuple[str | None, str | None]:
    """(--constraint value, type for a typed GRES): how the site is asked for gpu_type
    (known to be on the node set). A type the partition or constraint implies needs
    nothing more; a mixed node set gets the type the site's way, or is refused: a
    validated gpu_type is never dropped."""
    constraint = spec.constraint if profile.partitions_allowed else node.name
    gpu_type = spec.gpu_type
    if gpu_type is None or spec.gpus_per_node == 0:
        return constraint, None
    if profile.gpu_type_request == "gres":
        return constraint, gpu_type
    if set(node.gpu_types) == {gpu_type}:
        return constraint, None
    where = f"partition {partition}" if partition else f"constraint {node.name}"
    mixed = f"{where} mixes {', '.join(dict.fromkeys(node.gpu_types))} GPUs"
    if profile.gpu_type_request == "none":
        raise ConfigError("gpu_type", f"{profile.name} cannot request a GPU type "
                          f"(gpu_type_request: none) and {mixed}, so {gpu_type!r} cannot be "
                          f"honoured; choose a partition or constraint with only "
                          f"{gpu_type} GPUs, or set gpu_type_request in your profile")
    feature = profile.gpu_feature(gpu_type)
    if not constraint:
        return feature, None
    if feature in constraint.split("&"):
        return constraint, None
    if not _AND_ONLY.match(constraint):
        raise ConfigError("constraint", f"{constraint!r} cannot take the feature {feature!r} "
                          f"that selects {gpu_type} GPUs ({mixed}): Slurm cannot AND a "
                          f"feature onto alternatives; give one alternative, or features "
                          f"joined with '&'")
    return f"{constraint}&{feature}", None
