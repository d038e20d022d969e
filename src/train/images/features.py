"""What a job's image offers the job step, found at submit ("bring your own image").

Our images say it in their labels (org.train.image: `train` is inside, with torch and
NVML's Python binding). Any other image is asked by running its Python once on the login
node (`apptainer exec --cleanenv IMAGE PYTHON -c PROBE`, `docker run --rm IMAGE ...`):
its version, whether torch, `train` (and which version) and pynvml import, whether
nvidia-smi is on its PATH. Nothing is imported by the probe (importlib.util.find_spec),
so it takes well under a second. The answer is kept per image identity (a SIF's real path,
size and modification time; a Docker image's id) in ~/.cache/train/image-features.json.

An image without `train` gets the client's own launcher bound in (train.node.nodeentry); the
job is refused (exit 2, nothing queued) where the image cannot run it: a Python older than
nodeentry.MIN_PYTHON, no torch under --launch torchrun, or `--entry train`/`navsim`,
which run this package's training inside the image.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from train.client.slurm.job import ResolvedJob
from train.common import _proc
from train.common.entry import LAUNCHER_ROOT, MIN_PYTHON

PROBE_TIMEOUT = 300.0  # a large SIF on a slow shared file system, opened cold
CACHE_ENTRIES = 64
OURS_LABEL = "org.train.image"
# valid Python 2.7 and 3.x: an old Python must still say its version
PROBE = (
    "import sys, json, os\n"
    "out = {'python': list(sys.version_info[:3])}\n"
    "try:\n"
    "    from importlib.util import find_spec\n"
    "except ImportError:\n"
    "    find_spec = None\n"
    "here = os.path.realpath(os.getcwd())\n"
    "sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != here]\n"
    "for name in ('torch', 'train', 'pynvml'):\n"
    "    try:\n"
    "        out[name] = bool(find_spec and find_spec(name))\n"
    "    except Exception:\n"
    "        out[name] = False\n"
    "if out['train']:\n"
    "    try:\n"
    "        import train\n"
    "        out['train_version'] = str(getattr(train, '__version__', ''))\n"
    "    except Exception:\n"
    "        out['train'] = False\n"
    "out['nvidia_smi'] = any(os.access(os.path.join(d, 'nvidia-smi'), os.X_OK)\n"
    "                        for d in os.environ.get('PATH', '').split(os.pathsep) if d)\n"
    "sys.stdout.write('TRAIN-PROBE ' + json.dumps(out) + '\\n')\n")


@dataclass(frozen=True)
class Features:
    """What the image's Python offers; `source` says how it was found (labels, probe)."""

    python: tuple[int, ...]
    torch: bool
    train: bool
    pynvml: bool
    nvidia_smi: bool
    train_version: str = ""
    source: str = "probe"
    ours: bool = False  # its labels say it is built from our definitions: nothing to ask

    @property
    def python_text(self) -> str:
        return ".".join(map(str, self.python)) if self.python else "unknown"


def from_labels(labels: Mapping[str, str]) -> Features | None:
    """An image of ours (built from containers/*.def, or derived from one): its labels say
    so, and it has `train`, torch and pynvml. None for any other image."""
    if not labels.get(OURS_LABEL, "").strip():
        return None
    return Features(python=(), torch=True, train=True, pynvml=True, nvidia_smi=False,
                    source=f"label {OURS_LABEL}={labels[OURS_LABEL]}", ours=True)


def parse_probe(stdout: str) -> Features:
    """The probe's line; ValueError where there is none (the Python did not run) or where
    it is not what the probe prints."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("TRAIN-PROBE "):
            found = _strict(_loads(line[len("TRAIN-PROBE "):]))
            if not found.python:
                raise ValueError("the probe's answer has no Python version")
            return found
    raise ValueError("the probe printed no answer")


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except RecursionError:  # nested past the parser's depth: not the probe's answer
        raise ValueError("nested too deep") from None


_FLAGS = ("torch", "train", "pynvml", "nvidia_smi")


def _strict(data: object) -> Features:
    """Features from the probe's answer or a cache entry of one, exactly as the probe
    writes them (a list of at most 3 whole numbers, true/false, a version text);
    ValueError for anything else, e.g. a hand-edited or corrupted cache."""
    if not isinstance(data, dict):
        raise ValueError("not an object")
    version = data.get("python")
    flags = [data.get(name, False) for name in _FLAGS]
    if not isinstance(version, list) or len(version) > 3 or not all(
            type(v) is int and 0 <= v < 1000 for v in version) or not all(
            isinstance(f, bool) for f in flags) or not isinstance(
            data.get("train_version", ""), str) or data.get("ours", False) is not False:
        raise ValueError("not the probe's answer")
    torch, train, pynvml, nvidia_smi = flags
    return Features(tuple(version), torch, train, pynvml, nvidia_smi,
                    train_version=data.get("train_version", ""),
                    source=str(data.get("source", "probe")))


def probe_argv(runtime: str, binary: str, image: str, python: str) -> list[str]:
    """The image's Python running PROBE, with nothing of the host's environment."""
    if runtime == "docker":
        return [binary, "run", "--rm", "--network", "none", "--entrypoint", "env", image,
                python, "-c", PROBE]
    return [binary, "exec", "--cleanenv", image, python, "-c", PROBE]


# -- the cache ---------------------------------------------------------------------------
def cache_path(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or
                                                         os.path.expanduser("~"), ".cache")
    return Path(base) / "train" / "image-features.json"


def file_identity(path: str) -> str | None:
    """A SIF's (or sandbox's) identity: real path, size and modification time."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def cached(key: str, environ: Mapping[str, str]) -> Features | None:
    try:
        data = _loads(cache_path(environ).read_text(encoding="utf-8"))
        return _strict(data[key]) if isinstance(data, dict) and key in data else None
    except (OSError, ValueError):
        return None


def remember(key: str, found: Features, environ: Mapping[str, str]) -> None:
    """Keep the answer (the newest CACHE_ENTRIES); a cache that cannot be written is
    skipped: the next submit asks the image again."""
    path = cache_path(environ)
    try:
        data = _loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data.pop(key, None)
    data[key] = asdict(found)
    data = dict(list(data.items())[-CACHE_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


# -- asking the image --------------------------------------------------------------------
def _docker_facts(binary: str, image: str, environ: Mapping[str, str]
                  ) -> tuple[str, dict[str, str]] | None:
    """(image id, labels) from the engine; None where it does not say."""
    try:
        proc = _proc.run([binary, "image", "inspect", "--format",
                          "{{.Id}} {{json .Config.Labels}}", image], timeout=60,
                         check=False, env=dict(environ))
    except _proc.ProcError:
        return None
    if proc.returncode != 0:
        return None
    ident, _, labels = proc.stdout.strip().partition(" ")
    try:
        parsed = json.loads(labels) or {}
    except ValueError:
        parsed = {}
    return ident, {str(k): str(v) for k, v in parsed.items()}


_MEMO: dict[str, Features] = {}
_RUNTIME_CHATTER = ("INFO:", "WARNING:", "DEBUG:", "VERBOSE:")


def image_features(job: ResolvedJob, environ: Mapping[str, str]
                   ) -> tuple[Features | None, list[str]]:
    """What the job's image offers (labels, cache, else the probe), and notes on what
    could not be found out (the job is then rendered as for an image of ours)."""
    spec = job.spec
    image = spec.image or ""
    if spec.runtime not in ("docker", "apptainer") or not image:
        return None, []
    if spec.runtime == "apptainer" and "://" in image:
        return None, []  # fetched on the nodes: image_problems says so
    search = environ.get("PATH", os.defpath)
    names = ("docker",) if spec.runtime == "docker" else ("apptainer", "singularity")
    binary = next((b for b in map(lambda n: shutil.which(n, path=search), names) if b),
                  None)
    if spec.runtime == "docker":
        facts = _docker_facts(binary, image, environ) if binary else None
        if facts is None:
            return None, []  # image_problems says why the engine did not answer
        ident, labels = facts
    else:
        identity = file_identity(image)
        if identity is None:
            return None, []  # image_problems refuses it
        ident, labels = identity, _apptainer_labels(job, binary)
    ours = from_labels(labels)
    if ours is not None:
        return ours, []
    key = f"{spec.runtime}|{spec.python}|{ident}"
    found = _MEMO.get(key) or cached(key, environ)
    if found is None:
        if binary is None:  # (image_problems says what could not be checked)
            return None, []
        found, note = _probe(spec.runtime, binary, image, spec.python, environ)
        if found is None:
            return None, [note]
        if found.python:  # (a Python that did not run is asked again next time)
            remember(key, found, environ)
    _MEMO[key] = found
    return found, []


def _apptainer_labels(job: ResolvedJob, binary: str | None) -> dict[str, str]:
    from train.client import preflight

    path = Path(os.path.abspath(job.spec.image or ""))
    if binary is None and not path.is_dir():
        return {}
    facts = preflight.image_facts(path, binary or "", job.profile)
    return dict(facts.labels) if facts is not None else {}


def _probe(runtime: str, binary: str, image: str, python: str,
           environ: Mapping[str, str]) -> tuple[Features | None, str]:
    argv = probe_argv(runtime, binary, image, python)
    try:
        proc = _proc.run(argv, timeout=PROBE_TIMEOUT, check=False, env=dict(environ))
    except _proc.ProcError as exc:
        # (the reason alone: the command line holds the probe's whole program)
        return None, (f"--image {image}: its Python could not be asked what it holds: "
                      f"{binary} {argv[1]}: {exc.stderr.strip()[:200]}")
    try:
        return parse_probe(proc.stdout), ""
    except (ValueError, KeyError, TypeError):
        # (Apptainer's INFO/WARNING lines come after its FATAL one: "Cleaning up image...")
        said = [line for line in (proc.stderr or proc.stdout).strip().splitlines()
                if not line.startswith(_RUNTIME_CHATTER)]
        last = said[-1] if said else f"exit {proc.returncode}"
        last = last if len(last) <= 200 else last[:200] + "..."  # (a flood, cut short)
        if python in last and ("not found" in last or "No such file" in last):
            return Features(python=(), torch=False, train=False, pynvml=False,
                            nvidia_smi=False, source=f"probe failed: {last}"), ""
        # (the runtime could not start the image: image_problems has its own word on it)
        return None, f"--image {image}: its Python could not be asked what it holds ({last})"


# -- what the job needs of it ------------------------------------------------------------
def problems(job: ResolvedJob, found: Features) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for this job in an image with these features."""
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
    import dataclasses

    found, _ = image_features(job, os.environ if environ is None else environ)
    if found is None or found.train or job.spec.entry != "command":
        return job
    return dataclasses.replace(job, launcher_binds=launcher_binds())
