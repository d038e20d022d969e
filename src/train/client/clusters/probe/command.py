"""`train clusters probe NAME [--write]`: what it prints, and the command itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from train.client.clusters.probe.compare import differences, facts
from train.client.clusters.probe.site import Site, read_site
from train.client.clusters.probe.write import target, write_profile
from train.client.clusters.profiles import Profile, Registry


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
    from train.common.errors import ResourceError

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
