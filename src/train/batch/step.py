"""The job step of a chunk, on the batch host, from its folder to what a killed step left
on the nodes; train.batch.chunk builds the chain on it.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from train.batch import contract, saves
from train.batch.saves import STARTED, parse_ids, read_text, remove_file


def slurm(argv: List[str]) -> Tuple[int, str]:
    """A Slurm command: (exit code, its output and errors together). Its environment has
    none of the job's own SLURM_*/SBATCH_*/SALLOC_*/SQUEUE_* values (a nested sbatch would
    read or pass them on, squeue would filter by them) but SLURM_CONF (a site's
    non-default configuration)."""
    env = {k: v for k, v in os.environ.items() if k == "SLURM_CONF"
           or not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SQUEUE_"))}
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, env=env, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, str(exc)
    return proc.returncode, proc.stdout


class Exit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def engine_root() -> str:
    """The engine's folder (the run folder's copy): what `python3 ENGINE` runs."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Step:
    """The chunk's state from its start to its end (one per batch job run), and its step."""

    def __init__(self, job: Dict[str, Any], script: str, chunk: int, first: Optional[int],
                 step: List[str]) -> None:
        self.job = job
        self.run_dir = str(job["run_dir"])
        self.script = os.environ.get("TRAIN_SCRIPT") or script
        self.chunk = chunk
        self.first = first
        self.last_chunk = (first or 1) + int(job["max_chunks"]) - 1
        self.asked = int(job["walltime_seconds"])  # --time (the chunk's may be shorter)
        self.step_argv = step
        self.job_id = os.environ.get("SLURM_JOB_ID", "0")
        self.restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        if saves._number(self.restarts) is None:
            self.restarts = "0"
        self.self_ref = self.job_id  # what Slurm's own commands call this job
        self.start = time.time()
        self.start_progress: Optional[saves.Progress] = None
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.step_start: Optional[float] = None
        self.tmp = ""
        self.ready = ""
        self.stop_request = ""
        self.saved_since = 0.0
        self.terminating = False
        self.requeuing = False
        self.stop_sent = False
        self.usr1_pending = False
        self.usr1_busy = False
        self.step_done = False
        self.usr1_held = False
        self.ready_at_stop: Optional[int] = None
        self.stop_requested = False
        self.killed = False
        self.kill_at: Optional[float] = None
        self.kill_steps_at: Optional[float] = None
        self.guard_at: Optional[float] = None
        self.overran_flag = False
        self.overran = False
        self.known = False
        self.extend_tried = False
        self.last_save: Optional[float] = None

    # -- records --------------------------------------------------------------------
    def say(self, text: str) -> None:
        sys.stderr.write("{} train-job[{}]: {}\n".format(time.strftime("%H:%M:%S"),
                                                        self.chunk, text))
        sys.stderr.flush()

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def write(self, name: str, text: str, append: bool = False) -> bool:
        """A record of the run written (saves.write_small), or said why it could not be."""
        why = saves.write_small(self.path(name), text, append)
        if why is not None:
            self.say("could not write {}: {} (a program's file where the chain keeps its "
                     "own?)".format(name, why))
        return why is None

    def event(self, kind: str, detail: str = "") -> None:
        line = "{} {} {} {}".format(int(time.time()), self.chunk, self.job_id, kind)
        self.write(contract.CHAIN_EVENTS, line + (" " + detail if detail else "") + "\n",
                   append=True)

    def ids(self) -> List[Tuple[int, str]]:
        return parse_ids(read_text(self.path(contract.CHAIN_IDS)))

    def progress(self) -> Optional[saves.Progress]:
        """The work done so far: as the program last recorded it in the progress file, else
        as its saves show it; None where neither says."""
        return saves.file_progress(self.run_dir) or saves.framework_progress(
            self.job["resume_args"], self.job["save_paths"], self.job["program_dir"])

    # -- the step ---------------------------------------------------------------------
    def stale_tmp(self) -> str:
        """The node temporary folders of this chain's earlier jobs and of this job's
        earlier runs (requeued), as patterns JOBID-RESTART."""
        out = ["{}-*".format(job) for _, job in self.ids() if job != self.job_id]
        out += ["{}-{}".format(self.job_id, r) for r in range(int(self.restarts))]
        return " ".join(out)

    def chunk_folder(self) -> None:
        """The chunk's own folder in the run folder (never a node's /tmp: a chunk killed
        at its walltime cannot remove it, the next one does, wherever it runs)."""
        prefix = contract.CHUNK_DIR_PREFIX
        # a killed chunk's folder, readiness and stop-request files (never this one's: new)
        for name in os.listdir(self.run_dir):
            stale = self.path(name)
            if name.startswith(prefix) and os.path.isdir(stale) and not os.path.islink(stale):
                shutil.rmtree(stale, ignore_errors=True)
            elif name.startswith((".signal-ready-", ".stop-request-")):
                remove_file(stale)
        self.tmp = self.path("{}{}-{}".format(prefix, self.job_id, self.restarts))
        os.makedirs(os.path.join(self.tmp, "exits"), exist_ok=True)

    def step_environment(self) -> Dict[str, str]:
        """The walltime contract every program of the step is told (docs/your-program.md):
        where to write, which chunk this is, when to have checkpointed by, how to say the
        work is complete; and what the task wrappers need (out of the program's reach:
        each wrapper takes its own values out before the program starts)."""
        job, run = self.job, self.run_dir
        deadline = int(self.start) + int(job["walltime_seconds"]) - int(job["stop_margin"])
        tag = "{}-{}".format(self.job_id, self.restarts)
        self.ready = self.path(".signal-ready-" + tag)
        self.stop_request = self.path(".stop-request-" + tag)
        return {
            contract.SIGNAL_READY_VAR: self.ready,
            "TRAIN_RUN_DIR": run, "TRAIN_CHUNK": str(self.chunk),
            "TRAIN_MAX_CHUNKS": str(self.last_chunk),
            contract.STOP_SIGNAL_VAR: str(job["stop_signal"]),
            "TRAIN_STOP_MARGIN": str(job["stop_margin"]),
            contract.DEADLINE_VAR: str(deadline),
            "TRAIN_TIME_BUDGET": str(deadline - int(time.time())),
            "TRAIN_COMPLETE_FILE": self.path(contract.COMPLETE_MARKER),
            "TRAIN_PROGRESS_FILE": self.path(contract.PROGRESS_FILE),
            "TRAIN_METRICS_FILE": self.path(contract.METRICS_FILE),
            "TRAIN_STOP_REQUEST": self.stop_request,
            contract.TASK_EXITS_VAR: os.path.join(self.tmp, "exits"),
            contract.STALE_TMP_VAR: self.stale_tmp(),
            contract.MASTER_PORT_VAR: str(contract.free_job_port(int(self.job_id))),
        }

    def resume_argv(self) -> List[str]:
        """After a checkpointed stop of the run: the job's --resume-args, expanded (left
        out whole where a {newest:GLOB} matches nothing yet)."""
        args = self.job["resume_args"]
        if not args or not os.path.exists(self.path(contract.SAVED_MARKER)):
            return []
        got, why = saves.expand(args, self.job["program_dir"])
        if got is None:
            self.say("after a checkpointed stop, yet the resume arguments are left out: "
                     + why)
            return []
        shown, _ = saves.expand(self.job.get("resume_shown") or args,
                                self.job["program_dir"])
        self.say("resuming after a checkpointed stop: the program's arguments end with "
                 + " ".join(shown or got))
        return got

    def start_step(self) -> None:
        self.chunk_folder()
        # what a save is newer than: a file's time comes from a clock that ticks every few
        # milliseconds, so the start is a file's time too, and the step starts a tick later
        start = os.path.join(self.tmp, "start")
        open(start, "w").close()
        self.saved_since = os.stat(start).st_mtime
        time.sleep(0.02)
        env = self.step_environment()  # (chunk_folder removed any files of these names)
        argv = self.step_argv + self.resume_argv()
        self.proc = subprocess.Popen(argv, env=dict(os.environ, **env))
        self.step_start = time.time()

    def rank_files(self) -> List[str]:
        folder, base = os.path.split(self.ready)
        prefix = base + contract.READY_RANK_SUFFIX
        try:
            return [os.path.join(folder, n) for n in os.listdir(folder)
                    if n.startswith(prefix)]
        except OSError:
            return []

    def ranks_ready(self) -> int:
        """How many of the step's ranks said their handler is set, each in a file of its
        own; the step's own file (a program no wrapper started) counts as one rank."""
        count = len(self.rank_files())
        return count if count else int(os.path.exists(self.ready))

    def signal_step(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(sig)

    def term_tasks(self) -> None:
        """TERM to the step's tasks only (srun, and the engine, must not get it)."""
        if slurm(["scancel", "--signal=TERM", self.self_ref])[0] != 0:
            self.signal_step(signal.SIGTERM)

    def kill_steps(self) -> None:
        """KILL to the job's steps, never to the batch step (`scancel --signal=KILL JOB`
        would cancel the whole job): each numbered step by its id; srun itself where Slurm
        cannot be asked."""
        rc, out = slurm(["squeue", "--noheader", "--steps", "--jobs=" + self.self_ref,
                         "--format=%i"])
        sent = False
        for step in (out.split() if rc == 0 else []):
            if "." in step and step.rsplit(".", 1)[1][:1].isdigit():
                sent = slurm(["scancel", "--signal=KILL", step])[0] == 0 or sent
        if not sent:
            self.signal_step(signal.SIGKILL)

    def pass_stop(self) -> None:
        if self.job["stop_via"] == "scancel":
            self.term_tasks()
        else:
            self.signal_step(signal.SIGUSR1)
        self.overrun_guard()

    def overrun_guard(self) -> None:
        """Stop mode signal, once the stop is passed on: a step still running
        KILL_GRACE + OVERRUN_RESERVE seconds before the walltime is ended by the engine,
        so that the chunk ends before Slurm's TIMEOUT (which would fail its successor's
        afterok) and the chain can go on from an earlier save. Only where the margin
        leaves the program time to stop first."""
        job = self.job
        reserve = int(job.get("overrun_reserve", 10))
        if int(job["stop_margin"]) <= int(job["kill_grace"]) + reserve or self.guard_at:
            return
        self.guard_at = self.start + int(job["walltime_seconds"]) - int(job["kill_grace"]) \
            - reserve

    def usr1(self) -> None:
        """USR1's handler (and the engine's look every half second while one is held):
        nothing once the step has ended; never inside itself."""
        if self.step_done:
            return
        if self.usr1_busy:
            self.usr1_pending = True
            return
        self.usr1_busy = True
        try:
            self.usr1_pending = False
            self.on_usr1()
        finally:
            self.usr1_busy = False

    def on_usr1(self) -> None:
        """The walltime signal. Slurm may send it up to a minute early, even as the chunk
        starts; a program that has not yet set its handler would die of it or never see
        it. So until every rank says it is ready, and at most for the step's first
        STEP_GRACE seconds, it is held and looked at again every second. Passed on at the
        grace with ranks missing, it is passed on again each time one more rank says it is
        ready, until all have."""
        job = self.job
        ranks = int(job["step_ranks"])
        if job["stop_signal"] == "none":
            self.say("USR1 received; the job has no stop signal: not passed on")
            self.usr1_pending = False
            return
        now = time.time()
        since = int(now - (self.step_start or now))
        ready = self.ranks_ready()
        if self.stop_sent:
            if job["stop_mode"] != "kill" and self.ready_at_stop is not None \
                    and ready > self.ready_at_stop:
                self.say("{} of {} ranks ready now ({} when the stop was passed on): "
                         "passing it on again for the late ones".format(
                             ready, ranks, self.ready_at_stop))
                self.ready_at_stop = ready
                self.pass_stop()
            self.usr1_pending = ready < ranks and self.ready_at_stop is not None
            return
        if self.step_start is None or (ready < ranks and since < int(job["step_grace"])):
            if not self.usr1_held:
                self.usr1_held = True
                self.say("walltime signal {}s after the step started: passing it on when "
                         "the program is ready (at most {}s after its start; {} of {} "
                         "rank(s) ready now)".format(since, job["step_grace"], ready, ranks))
            self.usr1_pending = True
            return
        self.usr1_held = False
        self.stop_sent = True
        self.ready_at_stop = ready
        if job["stop_mode"] == "kill":
            self.usr1_pending = False
            self.kill()
            return
        self.say("walltime signal: asking the step to checkpoint and stop ({})".format(
            job["stop_signal"]))
        if ready < ranks:
            self.say("only {} of {} ranks are ready after {}s: passed on again when a late "
                     "one is".format(ready, ranks, since))
        self.usr1_pending = ready < ranks
        self.pass_stop()

    def kill(self) -> None:
        """Stop mode kill: the program has no handler and saves on its own; the chunk ends
        it (TERM to the step's tasks, KILL to its steps after KILL_GRACE seconds) and the
        next chunk continues from its last save."""
        grace = int(self.job["kill_grace"])
        self.say("walltime signal: ending the program (stop mode kill): TERM, then KILL "
                 "after {}s".format(grace))
        self.stop_sent = True
        self.killed = True
        self.kill_at = time.time()
        self.term_tasks()
        self.kill_steps_at = self.kill_at + grace

    def on_stop_request(self) -> None:
        """The program checkpointed and asked to end this chunk: TERM to the step's tasks,
        recorded as a checkpointed stop."""
        if self.terminating or self.stop_requested:
            return
        self.say("the program asked to end this chunk after its checkpoint: stopping the "
                 "step")
        self.stop_requested = True
        self.stop_sent = True
        self.term_tasks()

    def tick(self) -> None:
        """What the engine looks at while the step runs (every half second): a held or
        late walltime signal, the program's stop request, the overrun guard, KILL after
        the grace."""
        now = time.time()
        if self.usr1_pending:
            self.usr1()
        if not self.stop_requested and os.path.exists(self.stop_request):
            self.on_stop_request()
        if self.guard_at is not None and now >= self.guard_at and self.kill_steps_at is None:
            self.overran_flag = True
            self.say("the step has not stopped after the stop signal, and the walltime is "
                     "near: ending it (TERM, then KILL after {}s)".format(
                         self.job["kill_grace"]))
            self.term_tasks()
            self.kill_steps_at = now + int(self.job["kill_grace"])
        if self.kill_steps_at is not None and now >= self.kill_steps_at:
            self.kill_steps_at = float("inf")
            self.say("the program is still running {}s after the TERM: KILL".format(
                self.job["kill_grace"]))
            self.kill_steps()

    def wait_step(self) -> int:
        assert self.proc is not None
        while True:
            try:
                code = self.proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                self.tick()
        self.step_done = True
        # A stop request the program made and exited before it was seen: a stop all the
        # same, never "complete"
        if not self.stop_requested and os.path.exists(self.stop_request):
            self.say("the program asked to end this chunk after its checkpoint, and has ended")
            self.stop_requested = True
            self.stop_sent = True
        return 128 - code if code < 0 else code

    def task_records(self) -> List[str]:
        """The tasks' records (task.STARTED lines for a task that recorded no end)."""
        folder = os.path.join(self.tmp, "exits")
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return []
        found = [saves.read_small(os.path.join(folder, name)) for name in names]
        return [data.decode("utf-8", "replace") for data in found if data is not None]

    # -- the step's end ---------------------------------------------------------------
    def runtime_cleanup(self) -> None:
        """A step killed outright cannot stop its containers, nor remove its tasks'
        temporary folders: both are removed on every node of the job (`ENGINE clean`, one
        task a node: a step of this job, with the job's own Slurm variables), or on this
        one where no step can start. Only where something may be left: a Docker step, or
        a task that recorded no end (killed with its wrapper)."""
        ended = [r for r in self.task_records() if not r.startswith(STARTED)]
        if self.job["runtime"] != "docker" and len(ended) >= int(self.job.get(
                "step_tasks") or 0) and not (self.killed or self.overran_flag):
            return
        nodes = os.environ.get("SLURM_JOB_NUM_NODES", "1")
        argv = [sys.executable, "-E", "-s", engine_root(), "clean", self.job["runtime"],
                contract.DOCKER_JOB_LABEL + "=" + self.job_id,
                "{}-{}".format(self.job_id, self.restarts)]
        if nodes.isdigit() and int(nodes) > 1 and not self.terminating:
            try:
                code = subprocess.call(["srun", "--nodes=" + nodes, "--ntasks-per-node=1",
                                        "--kill-on-bad-exit=0", *argv], timeout=60)
            except (OSError, subprocess.SubprocessError) as exc:
                self.say("could not clean the job's nodes: {}".format(exc))
                code = 1
            if code == 0:
                return
        subprocess.call(argv)

    def cleanup(self) -> None:
        """The chunk's own files: its folder, the readiness and stop-request files, and a
        sweep task's empty log files that Slurm opened beside the sweep's logs."""
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        for path in [self.ready, self.stop_request, *(self.rank_files() if self.ready
                                                      else [])]:
            if path:
                remove_file(path)
        base = os.environ.get(contract.ARRAY_LOG_VAR, "") if os.environ.get(
            "SLURM_ARRAY_JOB_ID") else ""
        for path in (base + ".out", base + ".err") if base else ():
            with contextlib.suppress(OSError):
                if os.path.isfile(path) and os.path.getsize(path) == 0:
                    os.unlink(path)
