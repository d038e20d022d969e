"""The job's image: there, a SIF (apptainer) or in the Docker engine that answers here,
built for the partition's GPUs, offering what the step needs
(train.client.slurm.checks.imagefit)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from train.client.preflight.gpu import check_arch
from train.client.preflight.image import ImageFacts, image_facts, open_image
from train.client.preflight.runs_root import read_mounts
from train.client.slurm.checks.imagefit import image_features, problems, runtime_binary
from train.client.slurm.checks.problem import Problem
from train.client.slurm.resolve import ResolvedJob
from train.common import _proc

DOCKER_TIMEOUT = 60.0


def image_problems(job: ResolvedJob, environ: Mapping[str, str]
                   ) -> tuple[list[Problem], list[str]]:
    spec = job.spec
    image = spec.image
    if spec.runtime == "none" or not image:
        return [], []
    if spec.runtime == "docker":
        return _docker_image(image, environ)
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


def _docker_image(tag: str, environ: Mapping[str, str]) -> tuple[list[Problem], list[str]]:
    binary = runtime_binary("docker", environ)
    if binary is None:
        return [], [f"--image {tag} could not be checked: docker is not on PATH here"]
    try:
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
