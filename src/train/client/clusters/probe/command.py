"""`train clusters probe NAME [--write]`: what it prints, and the command itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from train.client.clusters.probe.compare import differences, facts
from train.client.clusters.probe.site import TIMEOUT, Site, read_site
from train.client.clusters.probe.write import target, write_profile
from train.client.clusters.profiles import Registry
from train.client.clusters.schema import Profile
from train.common.errors import ResourceError, TrainError


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
