"""What a job's image offers the job step, found at submit ("bring your own image").

Our images say it in their labels (org.train.image). Any other image's Python is run once
on the login node (PROBE): nothing is imported (find_spec), so it takes well under a
second; one that does not answer within PROBE_TIMEOUT is a refusal (a hang there would hang
the job's step). The answer is kept per image identity (train.images.feature_cache).
What a job needs of the image is the client's: train.client.slurm.checks.imagefit.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from train.common import _proc
from train.common.jsonio import parse_json_object
from train.images.feature_cache import WATCH_MAX, cache_path, read_entries, write_entries

__all__ = ["PROBE", "PROBE_TIMEOUT", "Asked", "Features", "cached", "docker_facts",
           "from_labels", "parse_probe", "probe_argv", "probe_timeout", "remember",
           "run_probe"]

PROBE_TIMEOUT = 60.0  # a large SIF on a slow shared file system, opened cold
PROBE_TIMEOUT_VAR = "TRAIN_PROBE_TIMEOUT"
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
    "bins = [d for d in os.environ.get('PATH', '').split(os.pathsep) if d]\n"
    "out['nvidia_smi'] = any(os.access(os.path.join(d, 'nvidia-smi'), os.X_OK)\n"
    "                        for d in bins)\n"
    # what decides the answer, for a sandbox's cache entry: the folders the imports and
    # the PATH search look in, the candidate site-packages folders, the interpreter
    "paths = [p for p in sys.path if p and os.path.isabs(p)] + bins\n"
    "try:\n"
    "    import site\n"
    "    paths += list(site.getsitepackages())\n"
    "except Exception:\n"
    "    pass\n"
    "paths += [sys.executable or '', os.path.realpath(sys.executable or '')]\n"
    "seen = []\n"
    "for p in paths:\n"
    "    if p and os.path.isabs(p) and p not in seen:\n"
    "        seen.append(p)\n"
    f"out['paths'] = seen[:{WATCH_MAX}]\n"
    "sys.stdout.write('TRAIN-PROBE ' + json.dumps(out) + '\\n')\n")


@dataclass(frozen=True)
class Features:
    python: tuple[int, ...]
    torch: bool
    train: bool
    pynvml: bool
    nvidia_smi: bool
    train_version: str = ""
    source: str = "probe"
    ours: bool = False  # its labels say it is built from our definitions: nothing to ask
    # a sandbox's: (path in the image, stamp) of what decides the answer (feature_cache)
    watch: tuple[tuple[str, str], ...] = ()
    cache_file: str = ""  # the cache it was read from (never written into it)

    @property
    def python_text(self) -> str:
        return ".".join(map(str, self.python)) if self.python else "unknown"


def from_labels(labels: Mapping[str, str]) -> Features | None:
    """An image of ours (its labels say so) has `train`, torch and pynvml; None: another."""
    if not labels.get(OURS_LABEL, "").strip():
        return None
    return Features(python=(), torch=True, train=True, pynvml=True, nvidia_smi=False,
                    source=f"label {OURS_LABEL}={labels[OURS_LABEL]}", ours=True)


def parse_probe(stdout: str) -> Features:
    """The probe's line; ValueError where there is none (the Python did not run) or where
    it is not what the probe prints."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("TRAIN-PROBE "):
            answer = line[len("TRAIN-PROBE "):].encode(errors="replace")
            found = _strict(parse_json_object(answer))  # ({}: not JSON, or nested too deep)
            if not found.python:
                raise ValueError("the probe's answer has no Python version")
            return found
    raise ValueError("the probe printed no answer")


_FLAGS = ("torch", "train", "pynvml", "nvidia_smi")


def _strict(data: object) -> Features:
    """Features from the probe's answer or a cache entry of one, exactly as the probe
    writes them; ValueError for anything else (a hand-edited or corrupted cache)."""
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
                    source=str(data.get("source", "probe")), watch=_watch(data))


def _watch(data: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """The probe's `paths` (stamps to come), or a cache entry's `watch` pairs."""
    paths, pairs = data.get("paths", []), data.get("watch", [])
    if not isinstance(paths, list) or not isinstance(pairs, list) or \
            len(paths) > WATCH_MAX or len(pairs) > WATCH_MAX:
        raise ValueError("not the probe's answer")
    if not all(isinstance(p, str) and len(p) < 4096 for p in paths) or not all(
            isinstance(w, list) and len(w) == 2 and all(isinstance(x, str) and len(x) < 4096
                                                        for x in w) for w in pairs):
        raise ValueError("not the probe's answer")
    return tuple((p, "") for p in paths) or tuple((w[0], w[1]) for w in pairs)


def probe_argv(runtime: str, binary: str, image: str, python: str, name: str = ""
               ) -> list[str]:
    """The image's Python running PROBE, with nothing of the host's environment; a Docker
    probe's container is named (`name`), to be removed where it does not answer."""
    if runtime == "docker":
        return [binary, "run", "--rm", *(["--name", name] if name else []), "--network",
                "none", "--entrypoint", "env", image, python, "-c", PROBE]
    return [binary, "exec", "--cleanenv", image, python, "-c", PROBE]


def probe_timeout(environ: Mapping[str, str]) -> float:
    text = environ.get(PROBE_TIMEOUT_VAR, "").strip()
    if not text:
        return PROBE_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 86400:  # (NaN too)
        raise ValueError(f"{PROBE_TIMEOUT_VAR}={text[:40]!r}: give the seconds to wait for "
                         "an image's Python to answer, a number > 0 (at most 86400)")
    return value


# -- the cache (train.images.feature_cache) ----------------------------------------------
def cached(key: str, environ: Mapping[str, str], notes: list[str] | None = None
           ) -> Features | None:
    """The kept answer for `key`, None where there is none or not the probe's; a cache
    file that cannot be used goes to notes."""
    path = cache_path(environ)
    data, warning = read_entries(path)
    if warning and notes is not None:
        notes.append(warning)
    if not data or key not in data:
        return None
    try:
        return replace(_strict(data[key]), cache_file=str(path))
    except ValueError:
        return None


def remember(key: str, found: Features, environ: Mapping[str, str]) -> None:
    """Keep the answer; a cache that cannot be used is skipped (the image is asked again)."""
    path = cache_path(environ)
    data, _ = read_entries(path)
    if data is None:  # (not a regular file: never written over)
        return
    entry: dict[str, object] = asdict(found)
    entry.pop("cache_file", None)
    if not found.watch:
        entry.pop("watch", None)
    data.pop(key, None)
    data[key] = entry
    write_entries(path, data)


# -- asking the image --------------------------------------------------------------------
def docker_facts(binary: str, image: str, environ: Mapping[str, str]
                 ) -> tuple[str, dict[str, str]] | None:
    """(image id, labels) from the engine; None where it does not say."""
    try:
        timeout = probe_timeout(environ)
    except ValueError:  # (refused where the probe reads it, naming the variable)
        timeout = 60.0
    try:
        proc = _proc.run([binary, "image", "inspect", "--format",
                          "{{.Id}} {{json .Config.Labels}}", image],
                         timeout=timeout, check=False, env=dict(environ), skip_hung=True)
    except _proc.ProcError:
        return None
    if proc.returncode != 0:
        return None
    ident, _, labels = proc.stdout.strip().partition(" ")
    parsed = parse_json_object(labels.encode(errors="replace"))  # ({}: none, or not JSON)
    return ident, {str(k): str(v) for k, v in parsed.items()}


@dataclass(frozen=True)
class Asked:
    """What asking an image found: `found` None where it could not be found out (the job is
    then rendered as for an image of ours)."""

    found: Features | None = None
    notes: tuple[str, ...] = ()
    refusal: str = ""


_RUNTIME_CHATTER = ("INFO:", "WARNING:", "DEBUG:", "VERBOSE:")


def run_probe(runtime: str, binary: str, image: str, python: str,
              environ: Mapping[str, str], timeout: float) -> Asked:
    """The image's Python asked what it holds (PROBE), for at most `timeout` seconds."""
    name = f"train-probe-{os.getpid()}-{secrets.token_hex(4)}" if runtime == "docker" else ""
    argv = probe_argv(runtime, binary, image, python, name)
    try:
        proc = _proc.run(argv, timeout=timeout, check=False, env=dict(environ))
    except _proc.ProcError as exc:
        if exc.timed_out:
            return Asked(refusal=_no_answer(binary, argv[1], image, python, timeout, name,
                                            environ))
        # (the reason alone: the command line holds the probe's whole program)
        return Asked(notes=(f"--image {image}: its Python could not be asked what it "
                            f"holds: {binary} {argv[1]}: {exc.stderr.strip()[:200]}",))
    try:
        return Asked(parse_probe(proc.stdout))
    except (ValueError, KeyError, TypeError):
        # (Apptainer's INFO/WARNING lines come after its FATAL one: "Cleaning up image...")
        said = [line for line in (proc.stderr or proc.stdout).strip().splitlines()
                if not line.startswith(_RUNTIME_CHATTER)]
        last = said[-1] if said else f"exit {proc.returncode}"
        last = last if len(last) <= 200 else last[:200] + "..."  # (a flood, cut short)
        if python in last and ("not found" in last or "No such file" in last):
            return Asked(Features(python=(), torch=False, train=False, pynvml=False,
                                  nvidia_smi=False, source=f"probe failed: {last}"))
        # (the runtime could not start the image: image_problems has its own word on it)
        return Asked(notes=(f"--image {image}: its Python could not be asked what it "
                            f"holds ({last})",))


def _no_answer(binary: str, verb: str, image: str, python: str, timeout: float, name: str,
               environ: Mapping[str, str]) -> str:
    """The refusal; a Docker probe's container is removed (the engine runs it, outside the
    process group _proc killed)."""
    stopped = "stopped"
    if name:
        try:
            gone = _proc.run([binary, "rm", "-f", name], timeout=60, check=False,
                             env=dict(environ)).returncode == 0
        except _proc.ProcError:
            gone = False
        stopped += (f", its container {name} removed" if gone else
                    f"; its container {name} may be left: `docker rm -f {name}`")
    return (f"--image {image}: its Python ({python}) did not answer in {timeout:g} s when "
            f"asked what it holds (`{os.path.basename(binary)} {verb} ... {python} -c ...`; "
            f"{stopped}): a Python that hangs here would hang the job's step too. Where the "
            f"image is only slow to open (a large image on a cold file system), wait longer "
            f"with {PROBE_TIMEOUT_VAR}=SECONDS, or skip the login node's checks with "
            "--no-check (the image must then have `train`)")
