"""Preflight, check 2: the image is there, readable, a SIF (or a sandbox, or a Docker
image), and opens; what it says about itself (ImageFacts), which the GPU checks read."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from train.client.clusters.schema import Profile
from train.client.preflight.result import IMAGE, RUNTIME, Check, Runner, _run, _tail
from train.client.preflight.runs_root import Mount, _storage
from train.common import _proc
from train.common.jsonio import read_json_object
from train.images.build import SIF_MAGIC

_INSPECT_TIMEOUT = 120.0  # a SIF without its metadata descriptor is inspected by running it
_SQUASHFS_MAGIC = (b"hsqs", b"sqsh")  # Singularity 2.x images: a bare squashfs
_SIF_HEADER = 128  # sylabs/sif's global header; its last 32 bytes: where the descriptors
# and the data objects lie (offset and length each, little-endian int64)


def _cut_short(head: bytes, size: int) -> str | None:
    """Why a file with a SIF header cannot hold what the header says, or None: its
    descriptors or data objects end past the end of the file."""
    import struct

    if len(head) < _SIF_HEADER:
        return f"{size} bytes, less than a SIF's {_SIF_HEADER}-byte header"
    descoff, desclen, dataoff, datalen = struct.unpack("<4q", head[96:128])
    end = max(descoff + desclen, dataoff + datalen)
    if min(descoff, desclen, dataoff, datalen) < 0 or end > size:
        return f"its SIF header says it holds {end} bytes, the file has {size}"
    return None


@dataclass(frozen=True)
class ImageFacts:
    labels: Mapping[str, str] = field(default_factory=dict)
    env_text: str = ""


def _check_image(chosen: str, image: str | None, binary: str | None, profile: Profile,
                 mounts: list[Mount], run: Runner, python: str = "python3"
                 ) -> tuple[Check, ImageFacts | None]:
    if chosen == "none":
        return Check(IMAGE, None, "runtime none: no image"), None
    if image is None:
        return Check(IMAGE, None, f"no image given (runtime {chosen} needs one: pass "
                     "--image, or set it once with train init --image)"), None
    if chosen == "docker":
        return _check_docker_image(image, binary, run)
    check, facts = _check_sif(Path(os.path.abspath(os.path.expanduser(image))), binary,
                              profile, mounts, run)
    if check.ok and binary is not None and facts is not None:
        check = _check_python(check, image, binary, python, facts, run)
    return check, facts


def open_image(path: Path, binary: str | None, profile: Profile, mounts: list[Mount]
               ) -> tuple[Check, ImageFacts | None]:
    """The image file as `train submit` sees it, opened with `apptainer inspect` where
    `binary` is given."""
    return _check_sif(path, binary, profile, mounts, _proc.run, strict=True)


def image_facts(path: Path, binary: str, profile: Profile) -> ImageFacts | None:
    """What an image says about itself (its labels), for `train submit`: a sandbox's
    labels.json (none where it cannot be read), else `apptainer inspect` (None where it
    cannot)."""
    if path.is_dir():
        labels = read_json_object(path / ".singularity.d" / "labels.json", None)
        return ImageFacts({str(k): str(v) for k, v in labels.items()})
    return _check_sif(path, binary, profile, [], _proc.run)[1]


def _check_sif(path: Path, binary: str | None, profile: Profile, mounts: list[Mount],
               run: Runner, strict: bool = False) -> tuple[Check, ImageFacts | None]:
    build = ("build it (`train image build base`, see docs/images.md) or copy "
             "it to a file system the compute nodes mount, and pass its path with --image")
    try:
        st = path.stat()
    except FileNotFoundError:
        return Check(IMAGE, False, f"{path} does not exist", build), None
    except OSError as exc:
        return Check(IMAGE, False, f"{path} cannot be reached: {exc.strerror or exc}",
                     build), None
    sandbox = False
    what = "an Apptainer sandbox"
    if path.is_dir():
        sandbox = (path / ".singularity.d").is_dir()
        if not sandbox:
            return Check(IMAGE, False, f"{path} is a directory, not an image (and not an "
                         "Apptainer sandbox: no .singularity.d inside)",
                         "pass the image file itself, e.g. --image /scratch/$USER/base.sif"), None
    elif not path.is_file():
        return Check(IMAGE, False, f"{path} is not a regular file (mode {st.st_mode:o})",
                     "pass the .sif file itself"), None
    if not os.access(path, os.R_OK):
        return Check(IMAGE, False, f"{path} is not readable by this user",
                     f"chmod a+r {path} (and a+x on its directories), or copy it to a "
                     "directory of yours"), None
    if not sandbox:
        problem, what = _file_header(path, st.st_size, strict, build)
        if problem is not None:
            return problem, None
    where, note = _storage(str(path), mounts, profile)
    warn = where not in ("shared", "single_host")
    seen = f"; {note}" if warn else ""
    fix = ("copy it to a file system the compute nodes mount"
           + (f" (e.g. under {profile.scratch_root})" if profile.scratch_root else "")
           + " and pass that path") if warn else ""
    if binary is None:
        return Check(IMAGE, None, f"{path} is there and readable ({what}), but not opened: "
                     f"apptainer is not on PATH (see {RUNTIME}){seen}", fix), None
    code, out, err = _run(run, [binary, "inspect", "--json", "--labels", "--environment",
                                str(path)], _INSPECT_TIMEOUT)
    if code != 0:
        return Check(IMAGE, False, f"`apptainer inspect {path}` failed (exit {code}): "
                     f"{_tail(err or out)}",
                     "the file is not an image this apptainer can open (an incomplete copy, "
                     "a damaged file, or built by a newer apptainer): " + build), None
    facts = _apptainer_facts(out)
    return Check(IMAGE, True, f"{path} opens (apptainer inspect){_label_summary(facts)}{seen}",
                 fix, warn=warn), facts


def _check_python(opened: Check, image: str, binary: str, python: str, facts: ImageFacts,
                  run: Runner) -> Check:
    """An image that is not one of ours (no org.train.image label) is asked what its Python
    holds, as `train submit` asks it (train.images.features): a Python that does not run,
    or one too old for the job's launcher, fails the check."""
    from train.common.entry import MIN_PYTHON
    from train.images import features

    if features.from_labels(facts.labels) is not None:
        return opened
    code, out, err = _run(run, features.probe_argv("apptainer", binary, image, python),
                          features.PROBE_TIMEOUT)
    try:
        found = features.parse_probe(out)
    except (ValueError, KeyError, TypeError):
        return Check(IMAGE, False, f"{opened.detail}; but its Python ({python}) does not "
                     f"run in it (exit {code}: {_tail(err or out)})",
                     "jobs run --python in the image: name the image's interpreter "
                     "(train doctor --preflight --python PATH, then train submit --python "
                     "PATH), or use an image with Python (one of ours: train image build)")
    minimum = ".".join(map(str, MIN_PYTHON))
    if found.python[:2] < MIN_PYTHON:
        return Check(IMAGE, False, f"{opened.detail}; but its Python ({python}) is "
                     f"{found.python_text}, and the job's launcher needs >= {minimum}",
                     "name a newer interpreter of the image with --python, or use an image "
                     "with a newer Python")
    holds = ", ".join(f"{name} {'yes' if getattr(found, name) else 'no'}"
                      for name in ("train", "torch", "pynvml"))
    bound = "" if found.train else " (jobs bind this client's launcher in)"
    return Check(IMAGE, opened.ok, f"{opened.detail}; not one of our images: its Python "
                 f"({python}) is {found.python_text}: {holds}{bound}", opened.fix,
                 warn=opened.warn)


def _file_header(path: Path, size: int, strict: bool, build: str) -> tuple[Check | None, str]:
    """The file's first bytes: a failed check where they are no image's (or a SIF's header
    promises more than the file holds), else what the file is."""
    try:
        with path.open("rb") as fh:
            head = fh.read(_SIF_HEADER)
    except OSError as exc:
        return Check(IMAGE, False, f"{path} cannot be read: {exc.strerror or exc}",
                     build), ""
    again = "copy or build it again (" + build + ")"
    if head[32:41] != SIF_MAGIC and head[:4] not in _SQUASHFS_MAGIC \
            and (strict or path.suffix == ".sif"):
        return Check(IMAGE, False, f"{path} is not a SIF image (no SIF header: "
                     f"{len(head)} bytes read; an incomplete copy, or another file)",
                     again), ""
    if head[32:41] != SIF_MAGIC:
        return None, "a file"
    short = _cut_short(head, size)
    if short is not None:
        return Check(IMAGE, False, f"{path} is cut short: {short} (an incomplete copy or "
                     "download)", again), ""
    return None, "a SIF"


def _apptainer_facts(out: str) -> ImageFacts:
    """`apptainer inspect --json`: {"data": {"attributes": {"labels": {...}, "environment":
    {file: text}}}}; older output is `key: value` lines."""
    try:
        data = json.loads(out)
        attributes = data["data"]["attributes"]
        labels = attributes.get("labels") or {}
        environment = attributes.get("environment") or {}
        if isinstance(labels, dict) and isinstance(environment, dict):
            return ImageFacts({str(k): str(v) for k, v in labels.items()},
                              "\n".join(str(v) for v in environment.values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    labels = {}
    for line in out.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key and " " not in key.strip():
            labels[key.strip()] = value.strip()
    return ImageFacts(labels, out)


def _label_summary(facts: ImageFacts) -> str:
    shown_keys = [k for k in ("org.train.image", "org.train.lock", "org.train.base-image")
                  if k in facts.labels]
    return f" [{', '.join(f'{k}={facts.labels[k]}' for k in shown_keys)}]" if shown_keys else ""


def _check_docker_image(image: str, binary: str | None,
                        run: Runner) -> tuple[Check, ImageFacts | None]:
    if binary is None:
        return Check(IMAGE, None, f"{image}: not opened, docker is not on PATH (see "
                     f"{RUNTIME})"), None
    code, out, err = _run(run, [binary, "image", "inspect", image], _INSPECT_TIMEOUT)
    if code != 0:
        said = _tail(err or out)
        if "daemon" in said.lower() or "docker.sock" in said:
            fix = ("start the Docker engine (ci/docker-up.sh on the test machine) or point "
                   "DOCKER_HOST at it")
        else:
            fix = ("build it (`train image build base --engine docker`, see docs/images.md) or "
                   "`docker load` it, and pass its tag with --image")
        return Check(IMAGE, False, f"`docker image inspect {image}` failed (exit {code}): "
                     f"{said}", fix), None
    facts = ImageFacts()
    try:
        config = json.loads(out)[0].get("Config") or {}
        labels = config.get("Labels") or {}
        env = config.get("Env") or []
        facts = ImageFacts({str(k): str(v) for k, v in labels.items()},
                           "\n".join(str(e) for e in env))
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        pass
    return Check(IMAGE, True, f"docker image {image} is there (docker image inspect)"
                 f"{_label_summary(facts)}"), facts
