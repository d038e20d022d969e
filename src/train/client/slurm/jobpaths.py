"""A job's paths: its run directory, `train run`'s results CSV, and what the container must
bind to reach them, the job's own binds and NAVSIM's data. Relative paths are taken from
the submit directory, where the job starts; the CSV goes to `train run` as an absolute
path, so every runtime writes the same file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from train.client.clusters.schema import Profile
from train.client.slurm.jobitems import Bind, parse_bind
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.navsim import NAVSIM_DATA_ROOT
from train.client.slurm.resumeargs import patterns
from train.common.errors import ConfigError
from train.common.yamlio import shown
from train.workloads.config import RunConfig


def job_paths(spec: JobSpec, profile: Profile, run_config: RunConfig | None) -> dict[str, Any]:
    """The run directory (--out, or runs/NAME, absolute; never the file system's root), the
    results CSV and the binds that reach both (ResolvedJob's run_dir, results_csv and
    binds)."""
    run_dir = Path(os.path.abspath(spec.out or os.path.join("runs", spec.name)))
    if run_dir == Path(run_dir.anchor):
        raise ConfigError("out", f"{run_dir} is the file system root; give a directory "
                          "for the run")
    extra = _extra_binds(spec, run_dir)
    # where a host path is written at the same path inside (a read-only bind is not)
    writable = [*profile.binds, str(run_dir),
                *(b.src for b in extra if b.src == b.dst and not b.read_only)]
    specs = [*profile.binds, str(run_dir), *(b.spec for b in extra)]
    csv: Path | None = None
    if run_config is not None:
        csv, csv_bind = _results_csv(spec, run_config, run_dir, writable)
        if csv_bind is not None:
            specs.append(csv_bind)
    binds = tuple(dict.fromkeys(specs))  # (each bind once: SRC:SRC:ro is not also SRC)
    if spec.chdir is not None and spec.runtime == "docker":
        _check_chdir_visible(spec.chdir, binds)
    if spec.runtime != "none":
        _check_newest_on_host(spec, binds)
    return {"run_dir": str(run_dir), "results_csv": None if csv is None else str(csv),
            "binds": binds}


def host_path(path: str, binds: Sequence[str]) -> str:
    """Where the batch host finds a path the program names in its container: under a
    bind's destination (the deepest), the same place under the bind's source; any other
    path as it is. What the host-side chain looks at (save paths, {newest:GLOB}) is
    mapped so; the program itself keeps the container's path."""
    path = os.path.normpath(path)
    found = [b for b in map(parse_bind, binds) if _under(Path(path), [b.dst])]
    if not os.path.isabs(path) or not found:
        return path
    bind = max(found, key=lambda b: len(b.dst))
    return os.path.normpath(os.path.join(bind.src, os.path.relpath(path, bind.dst)))


def _check_newest_on_host(spec: JobSpec, binds: Sequence[str]) -> None:
    """Refuse a {newest:GLOB} under a bind's destination that is not its source: the
    chain looks for it on the batch host, while the program must get the container's
    path, and one argument cannot be both."""
    for glob in patterns(spec.resume_argv):
        host = host_path(glob, binds)
        if host != os.path.normpath(glob):
            raise ConfigError("resume_args", f"{{newest:{glob}}} is looked for on the batch "
                              f"host, where {glob} is not the container's (a --bind shows "
                              f"{host} there): nothing would ever match; bind the folder at "
                              "its own path (--bind SRC, no :DST) and name it so in "
                              f"{{newest:{host}}}, or give a GLOB relative to --chdir")


def _check_chdir_visible(chdir: str, binds: Sequence[str]) -> None:
    """Docker's container has no host folder but those bound (apptainer binds the working
    folder and home itself): --chdir must be seen inside at its own path."""
    folder = Path(os.path.abspath(chdir))
    parsed = [parse_bind(b) for b in binds]
    if any(b.src == b.dst and _under(folder, [b.src]) for b in parsed):
        return
    elsewhere = [b.spec for b in parsed if _under(folder, [b.src])]
    seen = (f" ({', '.join(elsewhere)} shows it at another path)" if elsewhere else "")
    raise ConfigError("chdir", f"{folder} is not inside the docker container: docker sees "
                      "only the folders the job binds (" + ", ".join(b.spec for b in parsed)
                      + f"){seen}, so the program would start in a folder it does not "
                      f"have; bind it (--bind {folder}), or give a --chdir under one of "
                      "those")


def _under(path: Path, roots: Sequence[str]) -> bool:
    return any(path == Path(r) or Path(r) in path.parents for r in roots)


def _extra_binds(spec: JobSpec, run_dir: Path) -> list[Bind]:
    """The job's --bind items and NAVSIM's --data (at NAVSIM_DATA_ROOT in a container),
    each with an existing source, none hiding the run directory, one source a target."""
    extra = [parse_bind(b) for b in spec.bind]
    if spec.data is not None:  # a directory: NAVSIM's dataset/, its maps and exp/
        data = Path(os.path.abspath(spec.data))
        try:
            is_dir = data.is_dir()
        except OSError as exc:  # a name too long for the file system, a link loop
            raise ConfigError("data", f"{shown(str(data))}: {exc.strerror or exc}") from None
        if not is_dir:
            raise ConfigError("data", f"{data} is not a directory (it should hold NAVSIM's "
                              "dataset/ and maps, and exp/ for the experiments)")
        if spec.runtime != "none":  # (on the node itself: the roots are set, see resolve)
            extra.append(Bind(str(data), NAVSIM_DATA_ROOT))
    for bind in extra:
        _check_bind(spec, bind, run_dir)
    targets = [b.dst for b in extra]
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:
        raise ConfigError("bind", f"two binds go to {twice[0]}; one destination takes one "
                          f"source (--data goes to {NAVSIM_DATA_ROOT})")
    return extra


def _check_bind(spec: JobSpec, bind: Bind, run_dir: Path) -> None:
    """One bind: its source exists, the runtime can make it, the run directory stays."""
    if not os.path.exists(bind.src):
        raise ConfigError("bind", f"{bind.src} does not exist (a bind's source is a "
                          "path on the cluster's shared file system)")
    if spec.runtime == "none" and (bind.src != bind.dst or bind.read_only):
        raise ConfigError("bind", f"{bind.spec}: runtime none runs on the node itself "
                          "and can neither show a path elsewhere nor make it read-only; "
                          "use a container runtime or the path itself")
    # where the container runtime mounts its own, or the image keeps what it runs on
    owned = next((d for d in _RUNTIME_OWNED if _under(Path(bind.dst), [d])), None)
    if spec.runtime != "none" and owned is not None:
        raise ConfigError("bind", f"{bind.spec}: {spec.runtime} mounts its own {owned} in "
                          "the container (processes, kernel, devices and GPUs, or its own "
                          f"metadata), so nothing can be bound to {bind.dst}: bind it "
                          "elsewhere (e.g. /data) and point the program there")
    if spec.runtime != "none" and bind.dst in _IMAGE_SYSTEM:
        raise ConfigError("bind", f"{bind.spec}: a folder bound at {bind.dst} hides the "
                          f"image's own {bind.dst} (its programs, libraries or settings: "
                          "the container's Python would not start); bind it under a "
                          "folder of its own (e.g. /data)")
    moved = bind.src != bind.dst or bind.read_only
    if bind.dst == "/" or (moved and _under(run_dir, [bind.dst])):
        raise ConfigError("bind", f"{bind.spec}: the destination would hide the run "
                          f"directory {run_dir} or make it read-only (or cover the "
                          "whole file system)")


# the runtime mounts its own file systems there (processes, kernel, devices with the GPUs);
# apptainer keeps its metadata (environment, runscript) in /.singularity.d
_RUNTIME_OWNED = ("/proc", "/sys", "/dev", "/.singularity.d")
# the image's own programs and libraries: a folder bound over one of them hides them all
# (train's images keep their Python in /opt/venv)
_IMAGE_SYSTEM = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/usr", "/etc", "/opt")


def _results_csv(spec: JobSpec, run_config: RunConfig, run_dir: Path,
                 visible: Sequence[str]) -> tuple[Path, str | None]:
    """`train run`'s results CSV, absolute, and the folder to bind for it where the
    container sees it nowhere in `visible` (the default CSV's; a given one must be seen)."""
    if run_config.results_csv is not None:
        csv = Path(os.path.abspath(run_config.results_csv))
        if spec.runtime != "none" and not _under(csv.parent, visible):
            raise ConfigError("results_csv", f"{csv} is outside what the {spec.runtime} "
                              f"container sees (the run directory and the profile's "
                              f"binds: {', '.join(visible)}); put it under one of them")
        return csv, None
    # the default: beside the run directory, shared by the runs of that directory
    csv = run_dir.parent / "results.csv"
    if spec.runtime == "none" or _under(csv.parent, visible):
        return csv, None
    if csv.parent == Path(csv.parent.anchor):
        raise ConfigError("out", f"{run_dir} lies directly under {csv.parent}: the "
                          "results CSV beside it would need the whole root bound into "
                          "the container; use a deeper --out or --results-csv")
    return csv, str(csv.parent)
