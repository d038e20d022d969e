"""A job against its image ("bring your own image"): the image is there and built for the
partition's GPUs (image_problems); what it offers the job step, asked once per image and
Python in a submit, and whether that suits the job (feature_problems). An image without
`train` gets the client's own launcher bound in (train.node.nodeentry).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from train.client.preflight.gpu import check_arch
from train.client.preflight.image import ImageFacts, image_facts, open_image
from train.client.preflight.result import which
from train.client.preflight.runs_root import read_mounts
from train.client.slurm.checks.problem import Problem
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.resolve import ResolvedJob
from train.common import _proc
from train.common.entry import LAUNCHER_ROOT, MIN_PYTHON
from train.images.features import (
    Asked,
    Features,
    cached,
    docker_facts,
    file_identity,
    from_labels,
    how_to_clear,
    probe_timeout,
    remember,
    run_probe,
    sandbox_stamps,
)

DOCKER_TIMEOUT = 60.0


def image_problems(job: ResolvedJob, environ: Mapping[str, str]
                   ) -> tuple[list[Problem], list[str]]:
    spec = job.spec
    image = spec.image
    if spec.runtime == "none" or not image:
        return [], []
    if spec.runtime == "docker":
        return _docker_image(job, environ)
    if "://" in image:  # docker://, oras://, library://: apptainer fetches it on the node
        return [], [f"--image {image} is fetched by apptainer on the nodes; not checked here"]
    path = Path(os.path.abspath(image))
    binary = runtime_binary("apptainer", environ)
    # a SIF is opened as the nodes will open it where apptainer is here: one it cannot read
    # (cut short, damaged, from a newer apptainer) is refused here, not after the queue wait
    check, facts = open_image(path, None if path.is_dir() else binary, job.profile,
                              read_mounts())
    if check.ok is False:
        tilde = " (a '~' is not expanded in the job: give the full path)" \
            if image.startswith("~") else ""
        return [Problem("image", f"--image {image}: {check.detail}{tilde}; {check.fix}")], []
    notes = [f"--image {image}: {check.fix}"] if check.fix else []  # (storage the nodes
    # may not mount)
    identity = file_identity(image)
    if facts is not None and identity is not None:  # (what image_features reads of it)
        _SAID.setdefault(identity, (identity, dict(facts.labels)))
    found, seen = _arch_problems(job, path, binary, facts)
    return found, notes + seen


def feature_problems(job: ResolvedJob, environ: Mapping[str, str]
                     ) -> tuple[list[Problem], list[str]]:
    """What the image must offer the step (imagefit): Python, torch for --launch
    torchrun, `train` for its own entries, a Python that answers at all; no NVML for the
    GPU watch is a note."""
    asked = image_features(job, environ)
    notes = list(asked.notes)
    if asked.refusal:  # (its Python did not answer in time)
        return [Problem("image", asked.refusal, files=False)], notes  # (it says --no-check)
    if asked.found is None:
        return [], notes
    refusals, warnings = problems(job, asked.found)
    return [Problem("image", text) for text in refusals], notes + warnings


def _arch_problems(job: ResolvedJob, path: Path, binary: str | None,
                   facts: ImageFacts | None) -> tuple[list[Problem], list[str]]:
    """The partition's GPUs against the architectures the image's torch carries (its lock,
    read through its labels): a V100 job with the CUDA 13 image fails at its first kernel,
    after the queue wait."""
    if not job.node.gpu_types or job.spec.gpus_per_node == 0:
        return [], []
    if binary is None and not path.is_dir():
        return [], [f"--image {job.spec.image}: its GPU architectures were not compared with "
                    f"the {job.node.name} GPUs: apptainer is not on PATH here"]
    if facts is None:
        facts = image_facts(path, binary or "", job.profile)
    if facts is None:
        return [], []
    # the GPUs the job can land on: the type it asks for, else every type of the partition
    node = job.node if job.spec.gpu_type is None else \
        dataclasses.replace(job.node, gpu_types=(job.spec.gpu_type,))
    check = check_arch([node], True, "apptainer", facts)
    if check.ok is False:
        return [Problem("image", f"--image {job.spec.image}: {check.detail}; {check.fix}")], []
    return [], [f"--image {job.spec.image}: {check.detail}; {check.fix}"] if check.warn else []


def _docker_image(job: ResolvedJob, environ: Mapping[str, str]
                  ) -> tuple[list[Problem], list[str]]:
    tag = job.spec.image or ""
    binary = runtime_binary("docker", environ)
    if binary is None:
        return [], [f"--image {tag} could not be checked: docker is not on PATH here"]
    if _said(job, binary, environ) is not None:  # (the one look image_features reads too)
        return [], []
    try:  # the engine's own words on why it does not say
        proc = _proc.run([binary, "image", "inspect", "--format", "{{.Id}}", tag],
                         timeout=DOCKER_TIMEOUT, check=False, env=environ, skip_hung=True)
    except _proc.ProcError as exc:
        return [], [f"--image {tag} could not be checked: {exc}"]
    if proc.returncode == 0:
        return [], []
    said = (proc.stderr or proc.stdout).strip()
    if "no such image" in said.lower():
        return [Problem("image", f"--image {tag}: the Docker engine here has no such image; "
                        f"build it (`train image build base --engine docker --tag {tag}`) "
                        "or `docker load` it")], []
    last = said.splitlines()[-1] if said else f"exit {proc.returncode}"
    return [], [f"--image {tag} could not be checked (the Docker engine did not answer: "
                f"{last})"]


_MEMO: dict[str, Asked] = {}  # once per image and Python in a process: checks, then equip
_SAID: dict[str, tuple[str, dict[str, str]] | None] = {}  # (identity, labels), once an image


def image_features(job: ResolvedJob, environ: Mapping[str, str]) -> Asked:
    """What the job's image offers: its labels, the kept answer, else the probe (once)."""
    spec = job.spec
    image = spec.image or ""
    if spec.runtime not in ("docker", "apptainer") or not image:
        return Asked()
    if spec.runtime == "apptainer" and "://" in image:
        return Asked()  # fetched on the nodes: image_problems says so
    binary = runtime_binary(spec.runtime, environ)
    said = _said(job, binary, environ)
    if said is None:
        return Asked()  # image_problems says why: refused, or the engine did not answer
    ident, labels = said
    ours = from_labels(labels)
    if ours is not None:
        return Asked(ours)
    key = f"{spec.runtime}|{spec.python}|{ident}"
    if key not in _MEMO:
        _MEMO[key] = _ask(key, ident.startswith("sandbox:"), binary, spec, environ)
    return _MEMO[key]


def _said(job: ResolvedJob, binary: str | None, environ: Mapping[str, str]
          ) -> tuple[str, dict[str, str]] | None:
    """The image's (identity, labels), asked once a process (checks, features, equip)."""
    image = job.spec.image or ""
    key = f"{binary}|{image}" if job.spec.runtime == "docker" else file_identity(image)
    if key is None:
        return None  # image_problems refuses it
    if key not in _SAID and job.spec.runtime == "docker":
        _SAID[key] = docker_facts(binary, image, environ) if binary else None
    elif key not in _SAID:
        path = Path(os.path.abspath(image))  # (a sandbox's labels are read without apptainer)
        read = image_facts(path, binary or "", job.profile) if binary or path.is_dir() else None
        _SAID[key] = key, dict(read.labels) if read is not None else {}
    return _SAID[key]


def runtime_binary(runtime: str, environ: Mapping[str, str]) -> str | None:
    """The runtime's program on this PATH (for apptainer: apptainer, else singularity)."""
    names = ("docker",) if runtime == "docker" else ("apptainer", "singularity")
    return next(filter(None, (which(name, environ) for name in names)), None)


def _ask(key: str, sandbox: bool, binary: str | None, spec: JobSpec,
         environ: Mapping[str, str]) -> Asked:
    """The kept answer where it still holds (a sandbox's: its stamps unchanged), else the
    probe's, kept where the Python ran."""
    notes: list[str] = []
    image = spec.image or ""
    found = cached(key, environ, notes)
    if found is not None and sandbox and (not found.watch or sandbox_stamps(
            image, [p for p, _ in found.watch]) != found.watch):
        found = None  # (installed into or removed from since: asked again)
    if found is not None:
        return Asked(found, tuple(notes))
    if binary is None:  # (image_problems says what could not be checked)
        return Asked(None, tuple(notes))
    try:
        timeout = probe_timeout(environ)
    except ValueError as exc:
        return Asked(None, tuple(notes), str(exc))
    asked = run_probe(spec.runtime, binary, image, spec.python, environ, timeout)
    found = asked.found
    if found is None:
        return Asked(None, (*notes, *asked.notes), asked.refusal)
    paths = [p for p, _ in found.watch]
    found = dataclasses.replace(found, watch=sandbox_stamps(image, paths) if sandbox else ())
    if found.python:  # (a Python that did not run is asked again next time)
        remember(key, found, environ)
    return Asked(found, tuple(notes))


# -- what the job needs of it ------------------------------------------------------------
def problems(job: ResolvedJob, found: Features) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for this job in an image with these features; a refusal from
    a kept answer says where it is kept and how to have the image asked again."""
    refusals, warnings = _problems(job, found)
    if found.cache_file:
        kept = (f" (this is the answer kept from an earlier look into the image: "
                f"{how_to_clear(Path(found.cache_file))})")
        refusals = [text + kept for text in refusals]
    return refusals, warnings


def _problems(job: ResolvedJob, found: Features) -> tuple[list[str], list[str]]:
    spec = job.spec
    image = f"--image {spec.image}"
    if found.ours:  # our definitions pin a Python, torch, pynvml and this package
        return [], []
    if not found.python:
        return [f"{image}: its Python ({spec.python}) does not run in it "
                f"({found.source.removeprefix('probe failed: ')}): the job step runs "
                f"`{spec.python}` in the image; name the image's interpreter with --python"
                ], []
    minimum = ".".join(map(str, MIN_PYTHON))
    if found.python[:2] < MIN_PYTHON:
        return [f"{image}: its Python is {found.python_text} ({spec.python}), and the job's "
                f"launcher needs Python >= {minimum}: use an image with a newer Python, or "
                "name a newer interpreter of the image with --python"], []
    refusals: list[str] = []
    warnings: list[str] = []
    if not found.train and spec.entry != "command":
        refusals.append(f"{image} has no `train` package, and --entry {spec.entry} runs "
                        "this package's training inside the image: use one of our images "
                        "(or derive one: `train image new`), or run your own program with "
                        "--entry command")
    if job.launch == "torchrun" and not found.torch:
        refusals.append(f"{image}: its Python ({spec.python}, {found.python_text}) cannot "
                        "import torch, and --launch torchrun runs torch's launcher in the "
                        "image: use an image with torch, or --launch tasks")
    if job.gpu_watch is not None and not found.pynvml and not client_pynvml():
        warnings.append(f"{image} has no NVIDIA management library for Python (pynvml) "
                        "and this client has none to bind in: the GPU watch is off for "
                        "this job" + (" (nvidia-smi is there, but the watch reads NVML)"
                                      if found.nvidia_smi else ""))
    return refusals, warnings


# -- the bound launcher ------------------------------------------------------------------
def client_pynvml() -> str | None:
    """This client's pynvml (nvidia-ml-py is one pure-Python file), to bind in."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("pynvml")
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return origin if origin and origin.endswith("pynvml.py") else None


def launcher_binds() -> tuple[str, ...]:
    """The client's own `train` package (and its pynvml, where it has one) read-only at
    LAUNCHER_ROOT: what train.node.nodeentry runs from in an image without `train`."""
    import train

    package = os.path.dirname(os.path.abspath(train.__file__))
    binds = [f"{package}:{LAUNCHER_ROOT}/train:ro"]
    nvml = client_pynvml()
    if nvml is not None:
        binds.append(f"{nvml}:{LAUNCHER_ROOT}/pynvml.py:ro")
    return tuple(binds)


def equip(job: ResolvedJob, environ: Mapping[str, str] | None = None) -> ResolvedJob:
    """The job with the launcher bound in where its image has no `train` (asked of the
    image as image_features asks; the answer is kept, so after the submit checks this
    costs a label read)."""
    found = image_features(job, os.environ if environ is None else environ).found
    if found is None or found.train or job.spec.entry != "command":
        return job
    return dataclasses.replace(job, launcher_binds=launcher_binds())
