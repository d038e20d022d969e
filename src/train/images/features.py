"""What a job's image offers the job step, found at submit ("bring your own image"), and
where the answer is kept.

Our images say it in their labels (org.train.image). Any other image's Python is run once
on the login node (PROBE): nothing is imported (find_spec), so it takes well under a
second; one that does not answer within PROBE_TIMEOUT is a refusal (a hang there would hang
the job's step). What a job needs of the image is the client's:
train.client.slurm.checks.imagefit.

The answer is kept per image identity in ~/.cache/train/image-features.json, the newest
CACHE_ENTRIES. A SIF is known by its real path, size and modification time; a sandbox (a
folder) by its real path, and its answer holds the stamps of the folders its Python imports
from and searches (installing torch into one changes its stamp: the image is asked again).
A cache file that is not a regular file (a FIFO, a link to a device) is never read or
written over.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from train.common import _proc
from train.common.jsonio import parse_json_object, write_json_atomic

__all__ = ["CACHE_MAX_BYTES", "PROBE", "PROBE_TIMEOUT", "Asked", "Features", "cache_path",
           "cached", "docker_facts", "file_identity", "from_labels", "how_to_clear",
           "parse_probe", "probe_argv", "probe_timeout", "remember", "run_probe",
           "sandbox_stamps"]

CACHE_ENTRIES = 64
CACHE_MAX_BYTES = 1 << 20
WATCH_MAX = 200  # paths stamped for a sandbox's answer
_LINK_HOPS = 40
_WARNED: set[str] = set()
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
    # a sandbox's: (path in the image, stamp) of what decides the answer (sandbox_stamps)
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


# -- the cache -------------------------------------------------------------------------
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
    """Keep the answer among the newest CACHE_ENTRIES, the file written whole (a link's
    target replaced, the link kept); a cache that cannot be used is skipped (the image is
    asked again)."""
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
    kept = {k: v for k, v in list(data.items())[-CACHE_ENTRIES:]
            if _strict_json(v)}  # (a hand edit's 1e400: inf, which strict JSON refuses)
    with contextlib.suppress(OSError, ValueError):
        write_json_atomic(Path(os.path.realpath(path)), kept, indent=1, sort_keys=False,
                          fsync=False)


def cache_path(environ: Mapping[str, str], name: str = "image-features.json") -> Path:
    """NAME in train's cache folder (also a Docker build's record, dockerengine)."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or
                                                         os.path.expanduser("~"), ".cache")
    return Path(base) / "train" / name


def how_to_clear(path: Path) -> str:
    return f"remove {path} (or its entry for this image) to ask the image again"


def read_entries(path: Path) -> tuple[dict[str, object] | None, str]:
    """(the entries, a warning): {} where there are none yet or not ours (written anew);
    None, with one warning line the first time, where the file cannot be used."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}, ""
    except OSError as exc:
        data, problem = None, f"cannot be opened ({exc.strerror or exc})"
    else:
        try:
            data, problem = _read_open(fd)
        finally:
            os.close(fd)
    if not problem:
        return data, ""
    key = str(path)
    if key in _WARNED:
        return None, ""
    _WARNED.add(key)
    return None, (f"the image-feature cache {path} {problem}: not used, and images are "
                  f"asked each time; remove it to have a cache again")


def _read_open(fd: int) -> tuple[dict[str, object] | None, str]:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a folder"
                if stat.S_ISDIR(st.st_mode) else "not a file")
        return None, f"is not a regular file ({kind})"
    try:
        with open(fd, "rb", closefd=False) as fh:
            raw = fh.read(CACHE_MAX_BYTES + 1)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    if len(raw) > CACHE_MAX_BYTES:
        return None, f"is larger than {CACHE_MAX_BYTES // (1 << 20)} MiB"
    # {}: cut short, or not ours; NaN and Infinity (a hand edit) read as null, so the
    # entries can be written back as strict JSON (remember)
    return parse_json_object(raw, parse_constant=lambda _name: None), ""


def _strict_json(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    return True


# -- what an image is known by -------------------------------------------------------------
def file_identity(path: str) -> str | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return f"sandbox:{real}"
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def sandbox_stamps(root: str, paths: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(path, stamp) for each path inside the sandbox at `root` (as the image's Python
    sees it): the inode, modification time and size of what is there, or of the nearest
    folder above it that is there (where the path would be created), marked '-'."""
    real = os.path.realpath(root)
    out: dict[str, str] = {}
    for path in paths:
        if len(out) >= WATCH_MAX:
            break
        if path in out or not path.startswith("/"):
            continue
        host, whole = _inside(real, path)
        try:
            st = os.lstat(host)
        except OSError:
            out[path] = "?"
            continue
        out[path] = f"{'' if whole else '-'}{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
    return tuple(out.items())


def _inside(root: str, path: str) -> tuple[str, bool]:
    """`path` of the sandbox as a host path, its links followed inside `root` (an absolute
    link is from the sandbox's root); where a part is missing, the folder above it and
    False."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(root, *done, name)
        try:
            target = os.readlink(host) if os.path.islink(host) else None
            if target is None and not os.path.lexists(host):
                return os.path.join(root, *done), False
        except OSError:
            return os.path.join(root, *done), False
        if target is None:
            done.append(name)
            continue
        hops += 1
        if hops > _LINK_HOPS:  # a loop
            return os.path.join(root, *done), False
        if target.startswith("/"):
            done = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return os.path.join(root, *done), True


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
