"""Every task of a job step runs under this wrapper (`python3 ENGINE task -- COMMAND`),
on its node, outside the container: the chain engine's part on the nodes. Around the
command (`run`) it gives the task a temporary folder (TMPDIR) and each rank a readiness file
of its own, hands Apptainer the job's variables by name (--cleanenv drops the rest), and
records the task's end ("CODE TIME NODE [SIGNAL]") in a folder the program is never told
about. Slurm signals every process of the task: the wrapper's handlers only wait for the
command, which gets the signals itself; a command killed by a signal ends the wrapper by
the same signal, as srun would have seen it.

`ENGINE clean RUNTIME LABEL TAG`: what a step killed outright left on this node (its
tasks' temporary folders, a Docker runtime's containers), removed after it.
"""

import fnmatch
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from train.batch import contract, saves
from train.batch.saves import STARTED, events, read_text, remove_file

NV_NO_DRIVER = "no NVIDIA driver on this node"
APPTAINERS = ("apptainer", "singularity")


def say(text: str) -> None:
    sys.stderr.write("train: {}\n".format(text))
    sys.stderr.flush()


def remove_stale(base: str, patterns: str) -> None:
    """The temporary folders of this chain's earlier jobs (JOBID-RESTART patterns)."""
    for pattern in patterns.split():
        if "/" in pattern:
            continue
        for path in glob.glob(os.path.join(base, glob.escape(contract.TMP_PREFIX) + pattern
                                           + ".*")):
            shutil.rmtree(path, ignore_errors=True)


def apptainer_env(env: Dict[str, str]) -> None:
    """The job's pass-through variables as APPTAINERENV_ copies: --cleanenv drops the
    rest (apptainer's own --env would split PYTORCH_CUDA_ALLOC_CONF's commas)."""
    names = list(contract.PASS_THROUGH) + env.get(contract.ENV_NAMES_VAR, "").split()
    for name in list(env):
        if any(fnmatch.fnmatchcase(name, p) for p in names):
            env["APPTAINERENV_" + name] = env[name]
    tmp = env.get("TMPDIR", "")
    if tmp.startswith("/tmp/") and len(tmp) > 5:  # where apptainer binds it
        env["APPTAINERENV_TMPDIR"] = tmp


def image_of(argv: Sequence[str]) -> Optional[str]:
    """The image of `apptainer exec [OPTIONS] IMAGE ...`: the first word after its
    options (a --bind takes a value)."""
    skip = False
    for word in argv[2:]:
        if skip:
            skip = False
        elif word == "--bind":
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def check_apptainer(argv: Sequence[str]) -> Optional[int]:
    """What apptainer would not say, or say only after the walltime: --nv on a node
    without the driver, an image that is a FIFO or a device (it would wait on it)."""
    host = socket.gethostname()
    if list(argv[1:3]) == ["exec", "--nv"] and not os.path.exists("/dev/nvidiactl"):
        say("apptainer --nv on {}: {} (/dev/nvidiactl is missing): the program sees no "
            "GPU".format(host, NV_NO_DRIVER))
    image = image_of(argv)
    if image and os.path.exists(image) and not (os.path.isfile(image)
                                                or os.path.isdir(image)):
        say("apptainer on {}: the image {} is not a file or a folder there (a FIFO or a "
            "device: apptainer would wait on it)".format(host, image))
        return 2
    return None


def docker_argv(argv: List[str], env: Dict[str, str]) -> Tuple[str, List[str]]:
    """`docker run` hands the container to dockerd, outside the step's process tree and
    cgroup: Slurm's TERM and KILL never reach it. The container is named after the task,
    labelled with the job id (the engine removes what a killed step left, by label), and
    runs as the task's user with the job's pass-through names."""
    name = "train-{}-{}-{}-{}".format(env.get("SLURM_JOB_ID", "0"),
                                      env.get("SLURM_RESTART_COUNT", "0"),
                                      env.get("SLURM_STEP_ID", "0"),
                                      env.get("SLURM_PROCID", "0"))
    try:
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        user = str(os.getuid())
    ids = ["--user", "{}:{}".format(os.getuid(), os.getgid()), "-e", "USER=" + user]
    for group in sorted(set(os.getgroups()) | {os.getgid()}):  # as `id -G` lists them
        ids += ["--group-add", str(group)]
    patterns = env.get(contract.ENV_NAMES_VAR, "").split()
    for var in sorted(env):
        if any(fnmatch.fnmatchcase(var, p) for p in patterns):
            ids += ["-e", var]
    label = "{}={}".format(contract.DOCKER_JOB_LABEL, env.get("SLURM_JOB_ID", "0"))
    return name, [argv[0], argv[1], "--name", name, "--label", label, *ids, *argv[2:]]


def kill_wait() -> Optional[str]:
    """Slurm's KillWait, read from slurm.conf up front (no controller call in a signal
    handler); None where it does not say (Slurm's default is 30 s)."""
    found = None
    try:
        with open(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")) as f:
            for line in f:
                key, _, value = line.partition("=")
                value = value.split()[0] if value.split() else ""
                if key.strip().lower() == "killwait" and value.isdigit():
                    found = value
    except OSError:
        pass
    return found


def run_docker(argv: List[str], env: Dict[str, str]) -> int:
    """The container gets Slurm's signals by name: USR1 (how the engine says stop) as the
    job's stop signal, INT as INT, and TERM or INT start `docker stop -t KillWait` at once
    (TERM now, KILL when Slurm kills the step; dockerd carries it out even when a KILL ends
    this wrapper first). The docker CLI itself ignores them (it died of TERM before
    docker 23)."""
    missing = [v for v in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID") if v not in env]
    if missing:
        say("docker run under the task wrapper runs in a Slurm job step: {} is not "
            "set".format(", ".join(missing)))
        return 2
    name, full = docker_argv(argv, env)
    grace = kill_wait() or "30"  # Slurm's default
    stopping: List[int] = []

    def quiet(*words: str) -> None:
        subprocess.Popen(["docker", *words], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)

    def on_signal(sig: int, _frame: object) -> None:
        if sig == signal.SIGUSR1:
            quiet("kill", "--signal", env.get(contract.STOP_SIGNAL_VAR, "USR1"), name)
            return
        if sig == signal.SIGINT:  # (TERM is what `docker stop` sends)
            quiet("kill", "--signal", "INT", name)
        if not stopping:
            stopping.append(sig)
            quiet("stop", "-t", grace, name)

    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    def deaf() -> None:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)

    try:
        code = subprocess.Popen(full, env=env, preexec_fn=deaf).wait()  # noqa: PLW1509 (no threads)
        # the CLI says the container's end as a code (137: killed), never by dying of it
        return 128 - code if code < 0 else code
    finally:
        subprocess.call(["docker", "rm", "-f", name], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)


def record(folder: str, code: Optional[int], sig: Optional[int]) -> None:
    """The task's record for the engine (code None: it has started), written without
    following a link and without waiting on whatever else may sit at its name."""
    if not folder or not os.path.isdir(folder):
        return
    name = os.path.join(folder, "task-" + os.environ.get("SLURM_PROCID", "0"))
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    line = "{} {:.6f} {}{}\n".format(STARTED if code is None else code, time.time(), node,
                                     " {}".format(sig) if sig else "")
    remove_file(name)
    saves.write_small(name, line)


def run(argv: List[str]) -> int:
    # a stop passed on again for late ranks reaches this wrapper too as it prepares
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda *_: None)
    env = dict(os.environ)
    # the engine's values for this wrapper: never the program's
    exits = env.pop(contract.TASK_EXITS_VAR, "")
    record(exits, None, None)
    base = env.get("TMPDIR") or "/tmp"
    remove_stale(base, env.pop(contract.STALE_TMP_VAR, ""))
    tag = "{}-{}".format(env.get("SLURM_JOB_ID", "0"), env.get("SLURM_RESTART_COUNT", "0"))
    own: Optional[str] = None
    try:
        own = tempfile.mkdtemp(prefix=contract.TMP_PREFIX + tag + ".", dir=base)
        env["TMPDIR"] = own
    except OSError:
        pass
    ready = env.get(contract.SIGNAL_READY_VAR)
    if ready:
        env[contract.SIGNAL_READY_VAR] = contract.rank_ready_path(
            ready, int(env.get("SLURM_PROCID", "0") or 0))
    if os.path.basename(argv[0]) in APPTAINERS:
        apptainer_env(env)
        refused = check_apptainer(argv)
        if refused is not None:
            return finish(own, exits, refused, None)
        try:
            env["APPTAINER_TMPDIR"] = tempfile.mkdtemp(
                prefix="train-apptainer-{}.".format(env.get("SLURM_JOB_ID", "0")),
                dir=own or base)
        except OSError:
            say("apptainer on {}: cannot make a folder under {} for the unpacked "
                "image".format(socket.gethostname(), own or base))
            return finish(own, exits, 3, None)
    termed: List[float] = []
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: termed.append(time.time()))
    try:
        if argv[:2] == ["docker", "run"]:
            code = run_docker(argv, env)
        else:
            code = wait_task(subprocess.Popen(argv, env=env), termed, own)
    except OSError as exc:
        say("cannot start {}: {}".format(argv[0], exc))
        return finish(own, exits, 127, None)
    if code < 0:
        return finish(own, exits, 128 - code, -code)
    return finish(own, exits, code, None)


def wait_task(proc: "subprocess.Popen[bytes]", termed: List[float],
              own: Optional[str]) -> int:
    """The command's exit status. After `train cancel` (its event is the chain's last) a
    program that outlives Slurm's TERM is KILLed by Slurm KillWait seconds later, this
    wrapper with it: its temporary folder is removed a little before that (a program
    that stops on the TERM has its folder until it ends)."""
    wait = kill_wait()
    grace = max(1.0, float(wait) - 3.0) if wait else 5.0  # KillWait less a margin, else 5
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if own and termed and time.time() >= termed[0] + grace \
                    and cancelled(os.environ.get("TRAIN_RUN_DIR", "")):
                shutil.rmtree(own, ignore_errors=True)
                own = None


def cancelled(run_dir: str) -> bool:
    """The chain's last events hold `train cancel`'s."""
    text = read_text(os.path.join(run_dir, contract.CHAIN_EVENTS), 512, tail=True)
    # (the chunk's own "terminated" comes after it)
    return bool(events("\n".join(text.splitlines()[-3:]), contract.EV_CANCELLED))


def finish(own: Optional[str], exits: str, code: int, sig: Optional[int]) -> int:
    saves.deaf(sig)
    if own:
        shutil.rmtree(own, ignore_errors=True)
    record(exits, code, sig)
    if sig:
        # the same end as the program's, as srun would have seen it (KILL and STOP have
        # no handler to reset)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return code


def clean(runtime: str, label: str, tag: str) -> int:
    """What a killed step left on this node."""
    remove_stale(os.environ.get("TMPDIR") or "/tmp", tag)
    if runtime != "docker" or shutil.which("docker") is None:
        return 0
    try:
        out = subprocess.run(["docker", "ps", "-aq", "--filter", "label=" + label],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True, timeout=60, check=False).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return 0
    if out:
        say("removing containers left on {}: {}".format(socket.gethostname(), " ".join(out)))
        subprocess.call(["docker", "rm", "-f", *out], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    return 0
