"""Preflight on the login node (`train doctor --preflight`): will a job of this profile start?

Five checks, each saying how to fix what fails: the container runtime is there (and new
enough), the image opens, the account is one of the user's (the site's own command from the
profile, else sacctmgr), the runs root is writable and on a file system the compute nodes
share, and the image's CUDA build suits the nodes' NVIDIA driver where the profile records it.
A check that cannot know says so (SKIP) and never fails on not knowing; a warning (WARN) is a
pass with a fix. Every outside command goes through `run` (default: `run_command`, which runs
it in a process group of its own and kills the whole group when it times out) with a
timeout, found on `environ`'s PATH; the mount table is read from `mounts`: tests inject all.
Bad input (an unknown runtime, partition or constraint, an unusable account name or path)
raises ConfigError naming the field; everything else is a check's result.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from train import _proc
from train.clusters.profiles import NodeType, Profile
from train.errors import ConfigError, UsageError
from train.gpus import arch_runs, capability
from train.images.arch import BuildArch, read_header
from train.images.sources import containers_dir
from train.runtime.cuda_check import MIN_DRIVER, VARIANTS, parse_version, variant_for_driver
from train.yamlio import shown

RUNTIMES = ("auto", "apptainer", "docker", "none")
# every image needs it (containers/*.def: %arguments and --build-arg; README "Images")
MIN_APPTAINER = (1, 2, 0)
MOUNTS = Path("/proc/self/mounts")

# check names, in the order they run
RUNTIME, IMAGE, ACCOUNT, RUNS_ROOT, CUDA = ("container runtime", "image", "account",
                                            "runs root", "CUDA vs driver")
ARCH = "GPU architecture"

_VERSION_TIMEOUT = 30.0
_INSPECT_TIMEOUT = 120.0  # a SIF without its metadata descriptor is inspected by running it
_ACCOUNTS_TIMEOUT = 60.0

# File systems by what the compute nodes see of them. Network and cluster file systems are
# the same on every node; a local disk is this machine's alone; the volatile ones are also
# gone at the next reboot (or with the container the login shell runs in).
SHARED_FS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "wekafs",
                       "panfs", "cifs", "smb3", "smbfs", "glusterfs", "gfs2", "ocfs2", "afs",
                       "pvfs2", "orangefs", "vastnfs"})
# FUSE file systems (fuse.NAME) that reach a network store
SHARED_FUSE = frozenset({"ceph-fuse", "glusterfs", "sshfs", "s3fs", "gcsfuse", "rclone",
                         "juicefs", "beegfs", "weka", "gpfs", "lustre", "cvmfs2", "goofys",
                         "mountpoint-s3", "blobfuse", "blobfuse2"})
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "vfat", "jfs",
                      "reiserfs", "bcachefs"})
VOLATILE_FS = frozenset({"tmpfs", "ramfs", "devtmpfs", "overlay", "overlayfs", "aufs",
                         "squashfs", "fuse.fuse-overlayfs", "fuse.squashfuse"})
# node-local scratch on every cluster, whatever file system holds it
TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108  (names compared, never used)

_ACCOUNT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}")
# `--version` of SingularityCE ("singularity-ce version 3.11.4", "SingularityCE version
# 4.1") or of Singularity before the split ("singularity version 3.8.7"); Apptainer says
# "apptainer version 1.3.4"
_SINGULARITY_RE = re.compile(r"\bsingularity", re.IGNORECASE)
_SIF_MAGIC = b"SIF_MAGIC"  # sylabs/sif: after the 32-byte launch line
_SQUASHFS_MAGIC = (b"hsqs", b"sqsh")  # Singularity 2.x images: a bare squashfs


class Runner(Protocol):
    """The shape of `train._proc.run` that preflight uses (tests pass scripted ones)."""

    def __call__(self, argv: Sequence[str], *, timeout: float = ...,
                 check: bool = ...) -> subprocess.CompletedProcess[str]: ...


@dataclass(frozen=True)
class Check:
    """One check's outcome. ok: True passed, False failed, None skipped (cannot tell, or
    not applicable). `warn` marks a pass that deserves attention; `fix` says what to do."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""
    warn: bool = False

    @property
    def status(self) -> str:
        if self.ok is None:
            return "skip"
        if not self.ok:
            return "fail"
        return "warn" if self.warn else "pass"


@dataclass(frozen=True)
class ImageFacts:
    """What an opened image says about itself: its labels and environment text."""

    labels: Mapping[str, str] = field(default_factory=dict)
    env_text: str = ""


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str


def failed(checks: Sequence[Check]) -> bool:
    """Whether any check failed (the command's exit 1)."""
    return any(c.ok is False for c in checks)


def format_checks(checks: Sequence[Check]) -> list[str]:
    """One line per check: PASS/WARN/FAIL/SKIP, name, detail, and the fix where it failed
    or warned."""
    lines = []
    for c in checks:
        line = f"{c.status.upper():<4}  {c.name}: {c.detail}"
        if c.status in ("fail", "warn") and c.fix:
            line += f" Fix: {c.fix}"
        lines.append(line)
    return lines


def checks_json(checks: Sequence[Check]) -> dict[str, Any]:
    """{"ok": no check failed, "checks": [{name, status, ok, detail, fix}, ...]}."""
    return {"ok": not failed(checks),
            "checks": [{"name": c.name, "status": c.status, "ok": c.ok, "detail": c.detail,
                        "fix": c.fix} for c in checks]}


def run_command(argv: Sequence[str], *, timeout: float = 60.0,
                check: bool = True) -> subprocess.CompletedProcess[str]:
    """`train._proc.run` for commands that may hang (a site's apptainer, docker, account
    tool): argv runs as the leader of a new session, and on a timeout the whole process
    group is killed, not only argv's process (a script's `sleep` child holds its output
    open and would live on). Output is decoded as UTF-8 with replacement. Raises ProcError
    like `_proc.run`: 127 not found, 126 not startable, 124 timed out, the exit code where
    `check` and it failed."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        raise _proc.ProcError(argv, 127, f"{argv[0]}: command not found") from None
    except OSError as exc:  # E2BIG, EACCES, ...
        raise _proc.ProcError(argv, 126, f"{argv[0]} could not be started: {exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise _proc.ProcError(argv, 124, f"timed out after {timeout:g} s") from None
    finally:
        if proc.returncode is None:  # an exception other than the timeout: no orphans
            _kill_group(proc)
    result = subprocess.CompletedProcess(list(argv), proc.returncode,
                                         out.decode("utf-8", errors="replace"),
                                         err.decode("utf-8", errors="replace"))
    if check and result.returncode != 0:
        raise _proc.ProcError(argv, result.returncode, result.stderr)
    return result


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to proc's process group (it leads it: start_new_session), then reap it. Its
    pid is not reaped before the kill, so the group id cannot have been reused."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    # a grandchild that left the group (setsid) may still hold the pipes: do not wait on it
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    proc.wait()


def run_preflight(profile: Profile, *, image: str | Path | None, account: str | None,
                  runs_root: Path, partition_or_constraint: str | None,
                  runtime: str = "auto", environ: Mapping[str, str] | None = None,
                  run: Runner = run_command, mounts: Path = MOUNTS) -> list[Check]:
    """The five checks for jobs of `profile`, in order: container runtime, image, account,
    runs root, CUDA vs driver.

    `runtime` is apptainer, docker, none, or auto (apptainer for a file image, docker for
    an image name, else whichever is installed). `partition_or_constraint` is the job's
    partition (its constraint on sites without partitions, alternatives joined by '|');
    None: the profile's default partition, else every node type. Raises ConfigError for bad
    input, naming the field.
    """
    env = os.environ if environ is None else environ
    if runtime not in RUNTIMES:
        raise ConfigError("runtime", f"must be one of {', '.join(RUNTIMES)}; got "
                          f"{shown(runtime)}")
    image_text = None if image is None else str(image)
    if image_text is not None:
        _plain_path("image", image_text)
    runs_text = _plain_path("runs", str(runs_root))
    if account is not None and not _ACCOUNT_RE.fullmatch(account):
        raise ConfigError("account", f"{shown(account)} is not an account name (letters, "
                          "digits, '_', '.', '@', '+' and '-', at most 128)")
    nodes, named = _node_types(profile, partition_or_constraint)
    table = read_mounts(mounts)
    chosen = _pick_runtime(runtime, image_text, profile, env)
    runtime_check, binary = _check_runtime(chosen, runtime, profile, env, run)
    image_check, facts = _check_image(chosen, image_text, binary, profile, table, run)
    return [runtime_check, image_check, _check_account(profile, account, env, run),
            _check_runs_root(Path(runs_text), profile, table),
            _check_cuda(profile, nodes, named, chosen, facts),
            check_arch(nodes, named, chosen, facts)]


# -- input -----------------------------------------------------------------------------------
def _plain_path(field_name: str, text: str) -> str:
    if not text.strip():
        raise ConfigError(field_name, "is empty; give a path")
    if "\x00" in text:
        raise ConfigError(field_name, f"{shown(text)} holds a NUL character")
    return text


def _node_types(profile: Profile, name: str | None) -> tuple[list[NodeType], bool]:
    """The node types a job may land on, and whether the job named them (or the default)."""
    if not name:
        if profile.partitions_allowed and profile.default_partition:
            return [profile.partitions[profile.default_partition]], True
        return [*profile.partitions.values(), *profile.constraints.values()], False
    if profile.partitions_allowed and name in profile.partitions:
        return [profile.partitions[name]], True
    alternatives = name.split("|")
    if all(a in profile.constraints for a in alternatives):
        return [profile.constraints[a] for a in alternatives], True
    if profile.partitions_allowed:
        raise ConfigError("partition", f"unknown partition {shown(name)} on {profile.name}; "
                          f"known: {', '.join(profile.partitions)}")
    unknown = next(a for a in alternatives if a not in profile.constraints)
    raise ConfigError("constraint", f"unknown constraint {shown(unknown)} on {profile.name}; "
                      f"known: {', '.join(profile.constraints)} (alternatives with '|')")


def _which(name: str, environ: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=environ.get("PATH", os.defpath))


def _looks_like_file(image: str) -> bool:
    return (image.endswith(".sif") or image.startswith(("/", ".", "~"))
            or os.path.exists(os.path.expanduser(image)))


def _pick_runtime(runtime: str, image: str | None, profile: Profile,
                  environ: Mapping[str, str]) -> str:
    if runtime != "auto":
        return runtime
    if image is not None:
        return "apptainer" if _looks_like_file(image) else "docker"
    if _which("apptainer", environ) or _which("singularity", environ):
        return "apptainer"
    # the sites run apptainer; docker is the local (single-host) test cluster's runtime
    if profile.single_host and _which("docker", environ):
        return "docker"
    return "apptainer"


def _run(run: Runner, argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    """(returncode, stdout, stderr); a command that cannot start or times out is 127 / 124
    with the reason as its stderr."""
    try:
        proc = run(argv, timeout=timeout, check=False)
    except _proc.ProcError as exc:
        return exc.returncode, "", exc.stderr
    except OSError as exc:  # e.g. a PATH entry that is not executable
        return 126, "", str(exc)
    return proc.returncode, proc.stdout or "", proc.stderr or ""


def _tail(text: str, lines: int = 3, limit: int = 300) -> str:
    """The last `lines` non-empty lines of a command's output, on one line."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    out = " / ".join(kept)
    return out if len(out) <= limit else out[:limit] + "..."


# -- 1. container runtime --------------------------------------------------------------------
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
    binary = _which("apptainer", environ)
    if binary is None:
        other = _which("singularity", environ)
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
    binary = _which("docker", environ)
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


# -- 2. the image ----------------------------------------------------------------------------
def _check_image(chosen: str, image: str | None, binary: str | None, profile: Profile,
                 mounts: list[Mount], run: Runner) -> tuple[Check, ImageFacts | None]:
    if chosen == "none":
        return Check(IMAGE, None, "runtime none: no image"), None
    if image is None:
        return Check(IMAGE, None, f"no image given (runtime {chosen} needs one: pass "
                     "--image, or set it once with train init --image)"), None
    if chosen == "docker":
        return _check_docker_image(image, binary, run)
    return _check_sif(Path(os.path.abspath(os.path.expanduser(image))), binary, profile,
                      mounts, run)


def check_image_file(path: Path, profile: Profile, mounts: list[Mount]) -> Check:
    """The image file as `train submit` sees it, without running apptainer: there,
    readable, and a SIF (or a Singularity 2 squashfs, or a sandbox folder) whatever its
    name."""
    return _check_sif(path, None, profile, mounts, run_command, strict=True)[0]


def image_facts(path: Path, binary: str, profile: Profile) -> ImageFacts | None:
    """What an image says about itself (its labels), for `train submit`: a sandbox's
    labels.json, else `apptainer inspect`; None where it cannot be read."""
    if path.is_dir():
        try:
            labels = json.loads((path / ".singularity.d" / "labels.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(labels, dict):
            return None
        return ImageFacts({str(k): str(v) for k, v in labels.items()})
    return _check_sif(path, binary, profile, [], run_command)[1]


def _check_sif(path: Path, binary: str | None, profile: Profile, mounts: list[Mount],
               run: Runner, strict: bool = False) -> tuple[Check, ImageFacts | None]:
    build = ("build it (`train image build base`, see the README's Images section) or copy "
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
        try:
            with path.open("rb") as fh:
                head = fh.read(64)
        except OSError as exc:
            return Check(IMAGE, False, f"{path} cannot be read: {exc.strerror or exc}",
                         build), None
        if head[32:41] != _SIF_MAGIC and head[:4] not in _SQUASHFS_MAGIC \
                and (strict or path.suffix == ".sif"):
            return Check(IMAGE, False, f"{path} is not a SIF image (no SIF header: "
                         f"{len(head)} bytes read; an incomplete copy, or another file)",
                         "copy or build it again (" + build + ")"), None
        what = "a SIF" if head[32:41] == _SIF_MAGIC else "a file"
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
    if not shown_keys:
        return ""
    return " [" + ", ".join(f"{k}={facts.labels[k]}" for k in shown_keys) + "]"


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
            fix = ("build it (`train image build base --engine docker`, see the README) or "
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


# -- 3. account ------------------------------------------------------------------------------
def _user(environ: Mapping[str, str]) -> str | None:
    name = environ.get("USER") or environ.get("LOGNAME")
    if name:
        return name
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None


def _first_fields(text: str) -> list[str]:
    """The first field of every line, lower-cased (fields separated by whitespace or '|')."""
    out = []
    for line in text.lower().splitlines():
        fields = [f for f in re.split(r"[\s|]+", line) if f]
        if fields:
            out.append(fields[0])
    return out


def listed_accounts(text: str) -> set[str]:
    """What a site's account command lists, lower-cased: the first field of every line
    (fields separated by whitespace or '|': slist's and allocations' tables, sacctmgr -nP,
    one name a line), and every whole line. A word elsewhere in a line ("denied: acct is
    suspended", "some other text") is no listing."""
    return {*_first_fields(text),
            *(line.strip() for line in text.lower().splitlines() if line.strip())}


def _check_account(profile: Profile, account: str | None, environ: Mapping[str, str],
                   run: Runner) -> Check:
    hint = f" ({profile.account_hint})" if profile.account_hint else ""
    if account is None:
        if profile.account_required:
            return Check(ACCOUNT, False, f"{profile.name} requires an account and none is "
                         f"given{hint}", "pass --account ACCOUNT, or set it once: train init "
                         "--account ACCOUNT")
        return Check(ACCOUNT, None, f"no account given ({profile.name} does not require one)")
    notes: list[str] = []
    not_listed: str | None = None
    command = profile.account_list_command
    if command:
        binary = _which(command[0], environ)
        label = " ".join(command)
        if binary is None:
            notes.append(f"`{label}` is not on PATH")
        else:
            code, out, err = _run(run, [binary, *command[1:]], _ACCOUNTS_TIMEOUT)
            if code != 0:
                notes.append(f"`{label}` failed (exit {code}): {_tail(err or out, 1, 160)}")
            elif account.lower() in listed_accounts(out):
                return Check(ACCOUNT, True, f"{account} is listed by `{label}`")
            else:
                not_listed = f"`{label}` does not list {account}"
    user = _user(environ)
    sacctmgr = _which("sacctmgr", environ)
    if user is None:
        notes.append("the user name is unknown (no USER)")
    elif sacctmgr is None:
        notes.append("sacctmgr is not on PATH")
    else:
        code, out, err = _run(run, [sacctmgr, "-nP", "show", "assoc", f"user={user}",
                                    "format=account"], _ACCOUNTS_TIMEOUT)
        accounts = sorted(set(_first_fields(out)))  # -nP: one account a line
        if code != 0:
            notes.append(f"sacctmgr failed (exit {code}): {_tail(err or out, 1, 160)}")
        elif not accounts:
            notes.append(f"sacctmgr lists no associations for {user}")
        elif account.lower() in accounts:
            also = f" ({not_listed})" if not_listed else ""
            return Check(ACCOUNT, True, f"{account} is one of {user}'s accounts in sacctmgr"
                         f"{also}")
        else:
            return Check(ACCOUNT, False, f"{account} is not one of {user}'s accounts; "
                         f"sacctmgr lists: {', '.join(accounts)}"
                         + (f"; {not_listed}" if not_listed else ""),
                         f"pass one of them with --account{hint}")
    if not_listed:
        return Check(ACCOUNT, False, f"{not_listed}" + (f" ({'; '.join(notes)})" if notes
                                                          else ""),
                     f"check the spelling and pass one of the accounts it lists with --account"
                     f"{hint}")
    if not command:
        notes.insert(0, f"{profile.name} records no command that lists accounts "
                     "(account.list_command)")
    return Check(ACCOUNT, None, f"cannot tell whether {account} is yours: "
                 f"{'; '.join(notes)}; sbatch will say at submission")


# -- 4. runs root ----------------------------------------------------------------------------
def read_mounts(path: Path = MOUNTS) -> list[Mount]:
    """The mount table (/proc/self/mounts format); empty where it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mounts.append(Mount(_unescape(parts[1]), parts[2]))
    return mounts


def _unescape(field_text: str) -> str:
    """The kernel writes space, tab, newline and backslash in mount points as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_text)


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


def mount_of(path: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount holding `path` (absolute, symlinks resolved): the last of the longest."""
    best: Mount | None = None
    for m in mounts:
        if _under(path, m.point) and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def _storage(path: str, mounts: Sequence[Mount], profile: Profile) -> tuple[str, str]:
    """(kind, words) for where `path` lives: shared, single_host, volatile, temp, local or
    unknown."""
    real = os.path.realpath(path)
    mount = mount_of(real, mounts)
    if profile.single_host:
        return "single_host", (f"{profile.name} runs every node on this machine: its file "
                                "systems are the nodes' own")
    if mount is None:
        return "unknown", "the mount table could not be read: whether the compute nodes " \
            "see it is not known"
    fs = mount.fstype
    on = f"{fs} at {mount.point}"
    if fs in SHARED_FS or (fs.startswith("fuse.") and fs[5:] in SHARED_FUSE):
        return "shared", f"on a shared file system ({on})"
    if fs in VOLATILE_FS:
        return "volatile", f"on {on}: this machine's alone, and gone at its next restart"
    temp = next((t for t in TEMP_DIRS if _under(real, t)), None)
    if temp is not None:
        return "temp", f"under {temp} ({on}): this machine's local scratch"
    if fs in LOCAL_FS:
        return "local", f"on a local disk ({on}): compute nodes may not see it"
    return "unknown", f"on {on}: whether the compute nodes see it is not known"


def _try_write(directory: Path) -> str | None:
    """None when a file can be created (and is removed) in `directory`, else why not."""
    try:
        fd, name = tempfile.mkstemp(prefix=".train-preflight-", dir=directory)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    try:
        os.unlink(name)
    except OSError as exc:
        return f"a test file could not be removed: {exc.strerror or exc}"
    return None


def _unreachable(path: Path, where: Path, exc: OSError, elsewhere: str) -> Check:
    if exc.errno == errno.ELOOP:
        return Check(RUNS_ROOT, False, f"{path} cannot be reached: a loop of symbolic links "
                     f"(at {where} or above it: {exc.strerror})",
                     f"correct or remove the looping link (ls -l each part of {where}); or "
                     f"choose another directory: {elsewhere}")
    return Check(RUNS_ROOT, False, f"{path} cannot be reached: {exc.strerror or exc}",
                 f"choose another directory: {elsewhere}")


def _check_runs_root(root: Path, profile: Profile, mounts: Sequence[Mount]) -> Check:
    path = Path(os.path.abspath(os.path.expanduser(str(root))))
    scratch = profile.scratch_root
    elsewhere = (f"--runs DIR (and --out) under {scratch}/$USER" if scratch
                 else "--runs DIR (and --out) on a shared file system")
    existing = path
    while True:  # up to the nearest part that exists; no symbolic link may dangle on the way
        try:
            os.stat(existing)
            break
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            return _unreachable(path, existing, exc, elsewhere)
        try:
            link = stat.S_ISLNK(os.lstat(existing).st_mode)
        except OSError:
            link = False
        if link:
            try:
                target = os.readlink(existing)
            except OSError:
                target = "?"
            return Check(RUNS_ROOT, False, f"{path} cannot be created: {existing} is a "
                         f"symbolic link to {target}, which does not exist",
                         f"create the link's target (mkdir -p {target}) or remove the link "
                         f"(rm {existing}); or choose another directory: {elsewhere}")
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing != path and not existing.is_dir():
        return Check(RUNS_ROOT, False, f"{path} cannot be created: {existing} is a file",
                     f"choose another directory: {elsewhere}")
    if existing == path and not path.is_dir():
        return Check(RUNS_ROOT, False, f"{path} is a file, not a directory",
                     f"pass a directory: {elsewhere}")
    why = _try_write(existing)
    if why is not None:
        where = path if existing == path else f"{existing} (where {path} would be created)"
        return Check(RUNS_ROOT, False, f"{where} is not writable: {why}",
                     f"chmod u+w {existing}, or choose a directory of yours: {elsewhere}")
    state = "writable" if existing == path else f"does not exist yet; {existing} is writable"
    kind, note = _storage(str(existing), mounts, profile)
    scratch_note = ""
    if scratch and kind != "single_host":
        real = os.path.realpath(existing)
        inside = _under(str(path), scratch) or _under(real, os.path.realpath(scratch))
        scratch_note = (f"; under the site's scratch ({scratch})" if inside else
                        f"; not under the site's scratch ({scratch}): home directories are "
                        "often small")
    detail = f"{path}: {state}; {note}{scratch_note}"
    fix = (f"put runs where every node sees them: {elsewhere} (jobs write checkpoints and "
           "logs there from the compute nodes)")
    if kind in ("volatile", "temp"):
        return Check(RUNS_ROOT, False, detail, fix)
    if kind in ("local", "unknown"):
        return Check(RUNS_ROOT, True, detail, fix, warn=True)
    return Check(RUNS_ROOT, True, detail)


# -- 5. CUDA build vs driver -----------------------------------------------------------------
def image_cuda(facts: ImageFacts) -> tuple[str, tuple[int, int] | None, str]:
    """("cuda", (major, minor), source) | ("cpu", None, source) | ("unknown", None, "").

    In order: a label org.train.cuda, the lock the image's torch came from (org.train.lock:
    base-cu130.txt is CUDA 13.0, base-cpu.txt a CPU build; torch carries its own CUDA, so
    this is what meets the driver), the CUDA base (org.train.base-image nvidia/cuda:X.Y...),
    the base's CUDA_VERSION.
    """
    labels = facts.labels
    if "org.train.cuda" in labels:
        version = parse_version(labels["org.train.cuda"])
        if version is not None:
            return "cuda", version, f"label org.train.cuda={labels['org.train.cuda']}"
    lock = labels.get("org.train.lock", "")
    source = f"label org.train.lock={lock}"
    if re.search(r"(?:^|[^a-z])cpu(?:[^a-z]|$)", lock.lower()):
        return "cpu", None, source
    match = re.search(r"cu([0-9]{2,3})(?![0-9])", lock.lower())
    if match:
        digits = match.group(1)
        return "cuda", (int(digits[:-1]), int(digits[-1])), source
    base = labels.get("org.train.base-image", "")
    match = re.search(r"cuda:([0-9]+)\.([0-9]+)", base)
    if match:
        return ("cuda", (int(match.group(1)), int(match.group(2))),
                f"label org.train.base-image={base}")
    match = re.search(r"\bCUDA_VERSION\b[^0-9\n]{0,24}([0-9]+)\.([0-9]+)", facts.env_text)
    if match:
        return ("cuda", (int(match.group(1)), int(match.group(2))),
                f"CUDA_VERSION {match.group(1)}.{match.group(2)} in the image's environment")
    return "unknown", None, ""


def image_arch(facts: ImageFacts) -> tuple[BuildArch | None, str]:
    """The GPU architectures the image's torch carries, and where that was read: a label
    org.train.arch, else the header of the lock named by org.train.lock (the shipped locks
    record what their torch wheel carries, read by train.images.arch)."""
    labels = facts.labels
    if labels.get("org.train.arch"):
        build = read_header(f"# cuda {labels.get('org.train.cuda', 'unknown')}\n"
                            f"# arch {labels['org.train.arch']}\n")
        return build, f"label org.train.arch={labels['org.train.arch']}"
    lock = labels.get("org.train.lock", "")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+\.txt", lock):
        return None, ""
    try:
        text = (containers_dir() / "requirements" / lock).read_text(errors="replace")
    except (OSError, UsageError):
        return None, f"lock {lock} (not found in this checkout)"
    return read_header(text), f"lock {lock}"


def check_arch(nodes: list[NodeType], named: bool, chosen: str,
                facts: ImageFacts | None) -> Check:
    """Each GPU type of the job's nodes against the architectures the image carries: a
    V100 (sm_70) on the CUDA 13 image fails at its first kernel, after the queue wait."""
    if chosen == "none":
        return Check(ARCH, None, "runtime none: the nodes' own torch (`train run --device "
                     "cuda` compares it with the GPU at start)")
    if facts is None:
        return Check(ARCH, None, f"the image was not opened (see {IMAGE})")
    build, source = image_arch(facts)
    if build is None:
        return Check(ARCH, None, "the image records no GPU architectures" +
                     (f" ({source})" if source else " (labels org.train.arch or "
                      "org.train.lock)"))
    if build.cuda is None and not build.arch_list:
        return Check(ARCH, None, f"a CPU build ({source}): see {CUDA}")
    served: list[str] = []
    unserved: list[str] = []
    no_linalg: list[str] = []
    for node in nodes:
        for gpu in node.gpu_types:
            cap = capability(gpu)
            if cap is None:
                continue
            (served if arch_runs(cap, build.arch_list) else unserved).append(
                f"{node.name} {gpu} (sm_{cap[0]}{cap[1]})")
            if build.linalg is not None and arch_runs(cap, build.arch_list) and \
                    not arch_runs(cap, build.linalg):
                no_linalg.append(f"{node.name} {gpu} (sm_{cap[0]}{cap[1]})")
    arch = " ".join(build.arch_list)
    variants = ", ".join(VARIANTS)
    if not unserved and no_linalg:
        return Check(ARCH, True, f"{source} carries {arch}, but its linear algebra library "
                     f"(torch.linalg on CUDA) only {' '.join(build.linalg or ())}: none for "
                     f"{', '.join(no_linalg)}", "a job that uses torch.linalg needs another "
                     f"variant there (shipped locks: {variants})", warn=True)
    if not unserved:
        return Check(ARCH, True if served else None,
                     f"{source} carries {arch}" + (f"; serves {', '.join(served)}" if served
                                                   else "; no known GPU type to compare"))
    fix = ("use the image variant built for these GPUs (README, \"GPUs, drivers and image "
           f"variants\"; shipped locks: {variants})" +
           (", or another partition" if served else ""))
    detail = f"{source} carries {arch}: no code for {', '.join(unserved)}"
    if named or not served:
        return Check(ARCH, False, detail, fix)
    return Check(ARCH, True, f"{detail}; avoid those nodes", fix, warn=True)


def _driver_major(version: str) -> int:
    return int(version.split(".", maxsplit=1)[0])


def _check_cuda(profile: Profile, nodes: list[NodeType], named: bool, chosen: str,
                facts: ImageFacts | None) -> Check:
    if chosen == "none":
        return Check(CUDA, None, "runtime none: the nodes' own torch meets the driver (`train "
                     "run --device cuda` names a mismatch at start)")
    recorded = [n for n in nodes if n.driver_version]
    names = ", ".join(n.name for n in nodes)
    if not recorded:
        return Check(CUDA, None, f"{profile.name} records no NVIDIA driver for {names} (add "
                     "driver_version, from `nvidia-smi` on a node, to the node type in your "
                     "profile to have this checked)")
    if facts is None:
        return Check(CUDA, None, "the image's CUDA is not known: the image was not opened "
                     f"(see {IMAGE})")
    kind, version, source = image_cuda(facts)
    if kind == "unknown":
        return Check(CUDA, None, "the image records no CUDA version (labels org.train.lock "
                     "or org.train.base-image, or CUDA_VERSION in its environment)")
    gpu_nodes = [n for n in recorded if n.gpus_per_node > 0]
    if kind == "cpu" or version is None:
        if not gpu_nodes:
            return Check(CUDA, True, f"a CPU build ({source}) on nodes without GPUs")
        return Check(CUDA, False, f"the image is a CPU build ({source}): GPU jobs run "
                     f"--device cuda and stop at start on {', '.join(n.name for n in gpu_nodes)}",
                     "use the CUDA image: containers/base.def with its default "
                     "BASE_LOCK=base-cu130.txt (or --runtime none with a CUDA torch)")
    need = MIN_DRIVER.get(version[0])
    cuda = f"CUDA {version[0]}.{version[1]} ({source})"
    if need is None:
        return Check(CUDA, None, f"{cuda}: no minimum driver is known for CUDA {version[0]} "
                     "(train.runtime.cuda_check.MIN_DRIVER)")
    good = [n for n in recorded if _driver_major(n.driver_version or "0") >= need]
    bad = [n for n in recorded if n not in good]
    unrecorded = [n.name for n in nodes if not n.driver_version]
    have = ", ".join(f"{n.name} {n.driver_version}" for n in recorded)
    rest = f"; not recorded for {', '.join(unrecorded)}" if unrecorded else ""
    detail = f"{cuda} needs an NVIDIA driver >= {need}; {have}{rest}"
    if not bad:
        return Check(CUDA, True, detail)
    oldest = min(_driver_major(n.driver_version or "0") for n in bad)
    fits = max((major for major, minimum in MIN_DRIVER.items() if minimum <= oldest),
               default=None)
    rebuild = (f"build the image for CUDA {fits}.x, which driver {oldest} supports: "
               f"{variant_for_driver((fits, 9))}" if fits is not None else
               "ask the site about a newer driver")
    where = "--partition" if profile.partitions_allowed else "--constraint"
    suits = [n.name for n in (*profile.partitions.values(), *profile.constraints.values())
             if n.driver_version and _driver_major(n.driver_version) >= need]
    elsewhere = (f"run on {', '.join(suits)} ({where})" if suits else
                 f"run on nodes with a driver >= {need}")
    fix = f"{elsewhere}, or {rebuild}"
    if named or not good:
        return Check(CUDA, False, f"{detail}: too old on {', '.join(n.name for n in bad)}",
                     fix)
    return Check(CUDA, True, f"{detail}: avoid {', '.join(n.name for n in bad)} (driver too "
                 "old)", fix, warn=True)
