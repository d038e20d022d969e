"""Preflight, check 1: the container runtime (Apptainer, new enough and not Singularity;
Docker on the local test cluster), and which runtime `auto` means."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from train.client.clusters.schema import Profile
from train.client.preflight.result import RUNTIME, Check, Runner, _run, _tail, which

RUNTIMES = ("auto", "apptainer", "docker", "none")
# every image needs it (containers/*.def: %arguments and --build-arg; docs/images.md)
MIN_APPTAINER = (1, 2, 0)

_VERSION_TIMEOUT = 30.0
# `--version` of SingularityCE ("singularity-ce version 3.11.4", "SingularityCE version
# 4.1") or of Singularity before the split ("singularity version 3.8.7"); Apptainer says
# "apptainer version 1.3.4"
_SINGULARITY_RE = re.compile(r"\bsingularity", re.IGNORECASE)


def _pick_runtime(runtime: str, image: str | None, profile: Profile,
                  environ: Mapping[str, str]) -> str:
    if runtime != "auto":
        return runtime
    if image is not None:  # a file (a SIF or a sandbox), else a Docker tag
        file = image.endswith(".sif") or image.startswith(("/", ".", "~")) \
            or os.path.exists(os.path.expanduser(image))
        return "apptainer" if file else "docker"
    if which("apptainer", environ) or which("singularity", environ):
        return "apptainer"
    # the sites run apptainer; docker is the local (single-host) test cluster's runtime
    if profile.single_host and which("docker", environ):
        return "docker"
    return "apptainer"


def _module_fix(profile: Profile) -> str:
    if profile.modules:
        return (f"run `{'; '.join(profile.modules)}` first (the profile's set-up: jobs run it "
                "themselves, this shell needs it too) and try again")
    return ("install Apptainer >= 1.2.0 or ask the site's support for it; or choose another "
            "runtime (--runtime docker on a machine with a Docker engine, --runtime none to "
            "run --python on the nodes)")


def _check_runtime(chosen: str, asked: str, profile: Profile, environ: Mapping[str, str],
                   run: Runner) -> tuple[Check, str | None]:
    how = " (auto)" if asked == "auto" else ""
    if chosen == "none":
        return Check(RUNTIME, None, "runtime none: jobs run --python on the nodes, without a "
                     "container"), None
    if chosen == "docker":
        return _check_docker(how, environ, run)
    binary = which("apptainer", environ)
    if binary is None:
        other = which("singularity", environ)
        if other is not None:
            code, out, err = _run(run, [other, "--version"], _VERSION_TIMEOUT)
            said = _tail(out or err) or f"exit {code}"
            return Check(RUNTIME, False, f"apptainer{how} is not on PATH, only singularity "
                         f"({other}: {said}); jobs run `apptainer exec`",
                         _module_fix(profile) if profile.modules else
                         "put Apptainer >= 1.2.0 on PATH (where singularity is Apptainer, a "
                         "link named apptainer to it works), or ask the site's support"), None
        return Check(RUNTIME, False, f"apptainer{how} is not on PATH",
                     _module_fix(profile)), None
    code, out, err = _run(run, [binary, "--version"], _VERSION_TIMEOUT)
    if code != 0:
        return Check(RUNTIME, False, f"`{binary} --version` failed (exit {code}): "
                     f"{_tail(err or out)}", "check the installation (`apptainer --version` "
                     "should print its version); " + _module_fix(profile)), None
    text = _tail(out or err)
    loads = f"; jobs run `{'; '.join(profile.modules)}` first" if profile.modules else ""
    if _SINGULARITY_RE.search(text):
        return Check(RUNTIME, False, f"{binary} is not Apptainer: `{Path(binary).name} "
                     f"--version` says {text!r} (SingularityCE or Singularity, whose version "
                     "numbers are not Apptainer's); jobs run `apptainer exec` and the images "
                     f"need Apptainer >= {_dotted(MIN_APPTAINER)}",
                     ("put Apptainer first on PATH: " + _module_fix(profile))
                     if profile.modules else
                     "put Apptainer >= 1.2.0 first on PATH (not a link to singularity), or "
                     "ask the site's support for it"), None
    version = _version(text)
    if version is None:
        return Check(RUNTIME, True, f"{binary}: {text!r} (version not recognised; images need "
                     f"Apptainer >= {_dotted(MIN_APPTAINER)}){loads}",
                     "check `apptainer --version`", warn=True), binary
    if version < MIN_APPTAINER:
        return Check(RUNTIME, True, f"apptainer {_dotted(version)}{how} at {binary}: it runs "
                     f"images, but building them needs >= {_dotted(MIN_APPTAINER)} "
                     f"(%arguments, --build-arg){loads}",
                     "build the images elsewhere (or with Docker: train image build + train "
                     "image export, then `apptainer build X.sif docker-archive://X.tar`) and "
                     "copy the SIF here; or ask the site for a newer Apptainer",
                     warn=True), binary
    return Check(RUNTIME, True, f"apptainer {_dotted(version)}{how} at {binary} (>= "
                 f"{_dotted(MIN_APPTAINER)}){loads}"), binary


def _check_docker(how: str, environ: Mapping[str, str],
                  run: Runner) -> tuple[Check, str | None]:
    binary = which("docker", environ)
    if binary is None:
        return Check(RUNTIME, False, f"docker{how} is not on PATH (runtime docker is for a "
                     "machine with a Docker engine, such as the local test cluster)",
                     "install Docker (ci/bootstrap.sh) and start its engine (ci/docker-up.sh); "
                     "on a cluster use --runtime apptainer"), None
    code, out, err = _run(run, [binary, "--version"], _VERSION_TIMEOUT)
    if code != 0:
        return Check(RUNTIME, False, f"`{binary} --version` failed (exit {code}): "
                     f"{_tail(err or out)}", "check the Docker installation"), None
    return Check(RUNTIME, True, f"docker{how} at {binary}: {_tail(out)} (no apptainer here: "
                 "the image check asks the engine)"), binary


def _version(text: str) -> tuple[int, int, int] | None:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)
