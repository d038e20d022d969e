"""One chunk of a chain, on the batch host: the chain engine's main part.

The script `train render` writes ends by handing its chunk to the engine (`python3
ENGINE chunk SCRIPT [CHUNK [FIRST]] -- STEP...`); the engine reads the job record
(chain.json's "job", written once at submit) and then: records the chunk's start, starts
the step, submits the next chunk (afterok on this one: Slurm itself removes it when this
one fails), passes the walltime signal on to the step once its ranks are ready, ends a
step that does not stop in time, and decides what the step's end means for the chain:
failed (the first failing task's own code and node), complete, no progress, stopped
before any save, requeued, incomplete at the bound, or stopped with the next chunk to go
on. The decisions are pure functions (decide_*), unit-tested without Slurm.

Standard library only, valid Python 3.6: copied into the run folder at submit, so a
chain runs the engine it was submitted with whatever happens to the client.
"""

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from train.batch import contract, saves

Record = Dict[str, Any]
EXIT_USAGE = 2
GRACE_SECONDS = 15  # a TERM this close to the walltime is Slurm's time limit
NO_TASK_CODE = 1  # a step that started no task (srun said 0): the chunk failed


class Usage(Exception):
    """Bad arguments or a damaged record: said in the log, exit 2."""


def log(chunk: object, text: str) -> None:
    sys.stderr.write("{} train-job[{}]: {}\n".format(time.strftime("%H:%M:%S"), chunk, text))
    sys.stderr.flush()


def slurm_env() -> Dict[str, str]:
    """This environment without the job's own SLURM_*/SBATCH_*/SALLOC_*/SQUEUE_* values:
    a nested sbatch would read or pass them on, squeue would filter by them; SLURM_CONF
    stays so a site's non-default configuration is found."""
    return {k: v for k, v in os.environ.items()
            if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SBATCH_", "SALLOC_",
                                                      "SQUEUE_"))}


def slurm(argv: List[str], timeout: float = 120) -> Tuple[int, str]:
    """A Slurm command: (exit code, its output and errors together)."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, env=slurm_env(), timeout=timeout,
                              check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, str(exc)
    return proc.returncode, proc.stdout


def parse_ids(text: str) -> List[Tuple[int, str]]:
    """chain.ids: (chunk, job id) per line; lines that do not read so are passed over."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and saves._number(parts[0]) is not None:
            out.append((int(parts[0]), parts[1]))
    return out


def successors(queue: str, job: str, script: str) -> List[str]:
    """The queued jobs (squeue's "%i %E %o" lines) that wait on `job` (afterok) and run
    `script`: a chunk's successor is the only one; a job of the user's own that waits on
    the chunk (an evaluation after it) runs another script and is never taken."""
    found = []
    for line in queue.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        dep, cmd = "," + parts[1], parts[2]
        waits = any(d.startswith("afterok:" + job) and not d[len("afterok:" + job):][:1]
                    .isdigit() for d in dep.split(",") if d)
        if waits and (cmd == script or cmd.startswith(script + " ")):
            found.append(parts[0])
    return found


def first_failure(records: Sequence[str]) -> Optional[Tuple[int, str, Optional[int]]]:
    """The task that failed first, from the task wrappers' records ("CODE TIME NODE
    [SIGNAL]" each): (code, node, signal), whatever the code: a rank the OOM killer ended
    (KILL) fails first as much as one that raised. The TERM Slurm sends the other tasks
    comes after the failure; within a second of the first record (the nodes' clocks
    differ a little) a task that did not end of TERM is taken before one that did. None
    where no record says a task failed."""
    failed: List[Tuple[float, int, str, Optional[int]]] = []
    for text in records:
        parts = text.split()
        if len(parts) < 3:
            continue
        code, node = saves._number(parts[0]), parts[2]
        try:
            at = float(parts[1])
        except ValueError:
            continue
        if code is None or code == 0 or code > 255 or math.isnan(at):
            continue
        sig = saves._number(parts[3]) if len(parts) > 3 else None
        if not all(c.isalnum() or c in "._-" for c in node):
            node = ""
        failed.append((at, code, node, sig))
    if not failed:
        return None
    failed.sort()
    near = [f for f in failed if f[0] <= failed[0][0] + 1.0 and f[1] != TERM_CODE]
    at, code, node, sig = (near or failed)[0]
    return code, node, sig


TERM_CODE = 128 + signal.SIGTERM


def signal_name(number: Optional[int]) -> str:
    try:
        return signal.Signals(number).name if number else ""
    except ValueError:
        return "signal {}".format(number)


def overruns(ids_text: str, events_text: str) -> int:
    """How many chunks of this chain (the jobs of its ids file) overran their walltime
    after the stop signal and went on."""
    mine = {job for _, job in parse_ids(ids_text)}
    count = 0
    for line in events_text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[3] == contract.EV_OVERRAN and parts[2] in mine:
            count += 1
    return count


def read_text(path: str, limit: int = 4 * 1024 * 1024) -> str:
    data = saves.read_small(path, limit)
    return "" if data is None else data.decode("utf-8", "replace")


class Chunk:
    """The chunk's state from its start to its end (one per batch job run)."""

    def __init__(self, job: Record, script: str, chunk: int, first: Optional[int],
                 step: List[str]) -> None:
        self.job = job
        self.run_dir = str(job["run_dir"])
        self.script = os.environ.get("TRAIN_SCRIPT") or script
        self.chunk = chunk
        self.first = first
        self.last_chunk = (first or 1) + int(job["max_chunks"]) - 1
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
        log(self.chunk, text)

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def event(self, kind: str, detail: str = "") -> None:
        line = "{} {} {} {}".format(int(time.time()), self.chunk, self.job_id, kind)
        with open(self.path(contract.CHAIN_EVENTS), "a") as f:
            f.write(line + (" " + detail if detail else "") + "\n")

    def ids(self) -> List[Tuple[int, str]]:
        return parse_ids(read_text(self.path(contract.CHAIN_IDS)))

    def progress(self) -> Optional[saves.Progress]:
        return saves.progress(self.run_dir, self.job["resume_args"], self.job["save_paths"],
                              self.job["program_dir"])

    # -- the chain ------------------------------------------------------------------
    def array_task(self) -> None:
        """A sweep's chunk 1 runs as a task of its job array, recorded as ARRAY_TASK until
        it starts; from then on its own job id names it. Slurm's own commands (requeue,
        signals) name it ARRAY_TASK (the raw id of an array's last task is the array's)."""
        array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get(
            "SLURM_ARRAY_TASK_ID", "")
        if not array:
            return
        ref = "{}_{}".format(array, task)
        self.self_ref = ref
        ids = read_text(self.path(contract.CHAIN_IDS))
        lines = ids.splitlines()
        if not any(line.split()[1:2] == [ref] for line in lines):
            return
        new = "".join("{} {}\n".format(line.split()[0], self.job_id)
                      if line.split()[1:2] == [ref] else line + "\n" for line in lines)
        tmp = self.path(".{}.{}".format(contract.CHAIN_IDS, self.job_id))
        with open(tmp, "w") as f:
            f.write(new)
        os.replace(tmp, self.path(contract.CHAIN_IDS))

    def prologue(self) -> None:
        os.makedirs(self.path(contract.LOG_DIR), exist_ok=True)
        self.start = time.time()
        self.start_progress = self.progress()
        env = os.environ
        self.say("job {} (restart {}) on {}, {} node(s); chunk {} of at most {}".format(
            env.get("SLURM_JOB_ID", "?"), self.restarts, env.get("SLURM_JOB_NODELIST", "?"),
            env.get("SLURM_JOB_NUM_NODES", "?"), self.chunk, self.last_chunk))
        self.say("submit dir {}, run dir {}".format(env.get("SLURM_SUBMIT_DIR", "?"),
                                                    self.run_dir))
        self.say("runtime {}, image {}; work done so far: {}".format(
            self.job["runtime"], self.job.get("image") or "none",
            saves.progress_words(self.start_progress)))
        self.event(contract.EV_STARTED,
                   "{} {}".format(self.restarts, saves.detail(self.start_progress)))

    def record_successor(self, next_chunk: int, job_id: str, how: str) -> None:
        with open(self.path(contract.CHAIN_IDS), "a") as f:
            f.write("{} {}\n".format(next_chunk, job_id))
        self.say("chunk {} {} job {} (runs after this one succeeds)".format(
            next_chunk, how, job_id))
        self.event(contract.EV_EXTENDED, job_id)

    def extend(self) -> bool:
        """Submit the next chunk, once: a requeued or restarted chunk finds it recorded,
        and one whose sbatch reply was lost is found in the queue, not submitted again."""
        nxt = self.chunk + 1
        if self.job["requeue"] or self.terminating or self.chunk >= self.last_chunk:
            return True
        if any(c == nxt for c, _ in self.ids()):
            return True
        if self.extend_tried or self.restarts != "0":
            rc, out = slurm(["squeue", "--noheader", "--user={}".format(os.getuid()),
                             "--format=%i %E %o"])
            if rc != 0:
                if self.term_came():
                    return False
                self.say("could not look for a chunk {} submitted before (so none is "
                         "submitted again): {}".format(nxt, out.strip()))
                self.event(contract.EV_EXTEND_FAILED, "squeue: " + " ".join(out.split("\n"))
                           .strip())
                return False
            found = successors(out, self.job_id, self.script)
            if found:
                if found[1:]:  # (only where a look missed one: cancelled)
                    slurm(["scancel", *found[1:]])
                self.record_successor(nxt, found[0],
                                      "was submitted after all (sbatch's reply was lost) as")
                return True
        self.extend_tried = True
        argv = ["sbatch", "--parsable", "--dependency=afterok:" + self.job_id, self.script,
                str(nxt)] + ([str(self.first)] if self.first is not None else [])
        rc, out = slurm(argv)
        if rc != 0:
            if self.term_came():
                return False  # the TERM ended sbatch too
            self.say("could not submit chunk {}: {}".format(nxt, out.strip()))
            self.event(contract.EV_EXTEND_FAILED, " ".join(out.split("\n")).strip())
            return False
        job_id = out.strip().split(";")[0].split()[-1:] if out.strip() else []
        if not job_id or saves._number(job_id[0]) is None:
            self.say("could not read a job id from sbatch: {}".format(out.strip()))
            self.event(contract.EV_EXTEND_FAILED,
                       "no job id in: " + " ".join(out.split("\n")).strip())
            return False
        self.record_successor(nxt, job_id[0], "submitted as")
        return True

    def term_came(self) -> bool:
        """(set by the TERM handler at any time)"""
        return self.terminating

    def cancel_rest(self) -> None:
        """Cancel the chunks after this one (recorded before they can run)."""
        ids = [job for c, job in self.ids() if c > self.chunk]
        if ids:
            self.say("cancelling the waiting chunk(s): " + " ".join(ids))
            slurm(["scancel", *ids])

    # -- the step -------------------------------------------------------------------
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
        for name in os.listdir(self.run_dir):
            stale = self.path(name)
            if name.startswith(prefix) and os.path.isdir(stale) and not os.path.islink(stale):
                remove_tree(stale)
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
        env = self.step_environment()
        for path in [self.ready, self.stop_request, *self.rank_files()]:
            remove_file(path)
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

    def on_term(self) -> None:
        """Slurm sends TERM to every process of the job at the walltime, on scancel, on
        preemption and on requeue: the step's tasks get it from Slurm and checkpoint.
        Record which it was, and cancel the waiting chunk unless this job may come back."""
        if self.requeuing or self.terminating:
            return
        self.terminating = True
        elapsed = int(time.time() - self.start)
        if elapsed >= int(self.job["walltime_seconds"]) - GRACE_SECONDS:
            kind = contract.EV_TIMEOUT
            self.say("walltime reached after {}s: the step did not stop in time".format(
                elapsed))
        else:
            kind = contract.EV_TERMINATED
            self.say("terminated by Slurm after {}s (scancel, preemption or requeue)".format(
                elapsed))
        self.event(kind, str(elapsed))
        if not self.job["requeue_allowed"]:
            self.cancel_rest()

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
        folder = os.path.join(self.tmp, "exits")
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return []
        out = []
        for name in names:
            data = saves.read_small(os.path.join(folder, name))
            if data is not None:
                out.append(data.decode("utf-8", "replace"))
        return out

    # -- the step's end ---------------------------------------------------------------
    def runtime_cleanup(self) -> None:
        """A step killed outright cannot stop its containers, nor remove its tasks'
        temporary folders: both are removed on every node of the job (`ENGINE clean`, one
        task a node), or on this one where no step can start."""
        nodes = os.environ.get("SLURM_JOB_NUM_NODES", "1")
        argv = [sys.executable, "-E", "-s", engine_root(), "clean", self.job["runtime"],
                contract.DOCKER_JOB_LABEL + "=" + self.job_id,
                "{}-{}".format(self.job_id, self.restarts)]
        if nodes.isdigit() and int(nodes) > 1:
            rc, out = slurm(["srun", "--nodes=" + nodes, "--ntasks-per-node=1",
                             "--kill-on-bad-exit=0", *argv], timeout=120)
            sys.stderr.write(out)
            if rc == 0:
                return
        subprocess.call(argv)

    def step_status(self, code: int) -> int:
        """How the step ended, as the chain counts it: 0 for the stops the engine made;
        otherwise the first failing task's code (the chunk ends with it)."""
        records = self.task_records()
        if self.terminating:
            self.say("training step ended with exit code {} after the TERM".format(code))
            self.runtime_cleanup()
            raise Exit(143)
        if code == 143 and self.stop_requested:
            # the TERM it asked for ended a program without a TERM handler: its
            # checkpoint was written before it asked
            self.say("the step ended of the TERM that the program asked for: a stop")
            code = 0
        if self.killed:
            self.say("the step ended (exit code {}) after the tool ended it (stop mode "
                     "kill)".format(code))
            self.runtime_cleanup()
            code = 0
        if self.overran_flag:
            code = self.overran_step(code)
        if code == 0 and not records and not self.stop_sent and self.job.get("step_tasks"):
            # before Slurm 26.05.2 a step aborted before it launched makes srun exit 0
            self.say("the step started no task (srun exited 0, yet no task of it ran): "
                     "the chunk failed; see srun's lines above")
            self.fail(NO_TASK_CODE, None, None)
        if code != 0:
            failure = first_failure(records)
            node, sig = None, None
            srun_code = code
            if failure is not None:
                code, node, sig = failure
            where = " on node " + node if node else ""
            if sig:
                where += " (killed by {})".format(signal_name(sig))
            if code != srun_code:
                where += " (srun's: {})".format(srun_code)
            self.say("training step failed with exit code {}{}".format(code, where))
            if self.stop_sent and code in (138, 143):
                self.say("the program died of the stop signal {}: it needs a handler "
                         "(checkpoint, exit 0), or submit with --stop-signal none".format(
                             self.job["stop_signal"]))
            self.fail(code, node, sig)
        return code

    def fail(self, code: int, node: Optional[str], sig: Optional[int]) -> None:
        gpu_report()
        self.runtime_cleanup()
        self.event(contract.EV_FAILED, "{}{}".format(code, " " + node if node else ""))
        self.cancel_rest()
        raise Exit(code)

    def resume_point(self) -> bool:
        """A save the next chunk can go on from (one of this chunk, or the run's last
        checkpointed stop), and every {newest:GLOB} of the resume arguments matches."""
        if self.find_last_save() is None and not os.path.exists(
                self.path(contract.SAVED_MARKER)):
            return False
        return saves.expand(self.job["resume_args"], self.job["program_dir"])[0] is not None

    def find_last_save(self) -> Optional[float]:
        return saves.last_save(self.run_dir, self.job["save_paths"], self.saved_since,
                               self.job.get("save_skip") or contract.SAVE_SCAN_SKIP)

    def overran_step(self, code: int) -> int:
        """The step ran into the walltime after the stop signal, and the engine ended it.
        With a save to go on from, the chain goes on at most OVERRUN_BOUND times; beyond,
        or with none, the chunk failed of its walltime."""
        count = overruns(read_text(self.path(contract.CHAIN_IDS)),
                         read_text(self.path(contract.CHAIN_EVENTS))) + 1
        got = self.progress()
        bound = contract.OVERRUN_BOUND
        if count <= bound and self.resume_point():
            self.say("the step ran into the walltime after the stop signal (it ended with "
                     "exit code {}, ended by the tool): the chain goes on from the last "
                     "save ({} of at most {} times in this chain)".format(code, count, bound))
            self.event(contract.EV_OVERRAN, "{} {}".format(count, saves.detail(got)))
            self.overran = True
            return 0
        elapsed = int(time.time() - self.start)
        if count > bound:
            self.say("the step ran into the walltime after the stop signal again: it did {} "
                     "times already in this chain, the bound of overruns; the chain stops "
                     "here (the program needs longer than --signal-margin to stop: raise "
                     "it)".format(bound))
            detail = "{} {}".format(elapsed, contract.OVERRUN_BOUND_WORD)
        else:
            self.say("the step ran into the walltime after the stop signal, with no save to "
                     "go on from; the chain stops")
            detail = str(elapsed)
        self.runtime_cleanup()
        self.event(contract.EV_TIMEOUT, detail)
        self.cancel_rest()
        raise Exit(143)

    def end_if_done(self, got: Optional[saves.Progress]) -> None:
        """The chain ends here when the work is complete, or when this chunk added none."""
        if os.path.lexists(self.path(contract.COMPLETE_MARKER)):
            self.say("run complete")
            self.event(contract.EV_COMPLETE, saves.detail(got))
            self.cancel_rest()
            raise Exit(0)
        # a program whose progress the tool cannot read is not judged by it; nor a chunk
        # that overran (it goes on from the save before, a bounded number of times)
        judged = not self.job["complete_on_success"] or self.known
        before = (self.start_progress or (0, 0))[0]
        if judged and not self.overran and (got or (0, 0))[0] <= before:
            self.say("the program made no progress in this chunk (work done {} at its "
                     "start, {} now): it started over from zero or did no work; the chain "
                     "stops here. {}; see the step's log".format(
                         saves.detail(self.start_progress), saves.detail(got),
                         self.resume_hint()))
            self.event(contract.EV_NO_PROGRESS, saves.detail(got))
            self.cancel_rest()
            raise Exit(0)

    def resume_hint(self, nxt: bool = False) -> str:
        if self.job["resume_args"]:
            return "the program gets --resume-args {}: it must go on from them".format(
                " ".join(self.job.get("resume_shown") or self.job["resume_args"]))
        if nxt:
            return "it goes on from the save only if the program resumes by itself"
        return ("a program that resumes only when told needs --resume-args, e.g. "
                "'--resume_from_checkpoint {newest:out/checkpoint-*}' (Hugging Face Trainer) "
                "or '--ckpt_path {newest:checkpoints/*.ckpt}' (Lightning)")

    def saved_at(self, got: Optional[saves.Progress]) -> None:
        """When the chunk last saved. A stop counts as checkpointed only when something
        was saved since the chunk began: the chain ends here where nothing was."""
        got_args, why = saves.expand(self.job["resume_args"], self.job["program_dir"])
        if got_args is None:
            self.unsaved(got, "{} the next chunk can go on from: {}; the chain stops "
                         "here".format(contract.UNSAVED_TEXT, why))
        found = self.find_last_save()
        if self.overran and found is None:
            marker = read_text(self.path(contract.SAVED_MARKER), 256).split()
            self.last_save = float(marker[2]) if len(marker) > 2 and saves._number(
                marker[2]) is not None else time.time()
        elif got != self.start_progress:
            self.last_save = found or time.time()
        elif found is None:
            paths = " ".join(self.job["save_paths"])
            self.unsaved(got, "{}: the progress file, the run folder {}show nothing saved "
                         "since this chunk began; the chain stops here. Submit the same job "
                         "again (with a longer --time if the program saves too late for "
                         "it): the chain goes on at chunk {}".format(
                             contract.UNSAVED_TEXT, "and " + paths + " " if paths else "",
                             self.chunk + 1))
        else:
            self.last_save = found

    def unsaved(self, got: Optional[saves.Progress], text: str) -> None:
        self.say(text)
        self.event(contract.EV_UNSAVED, saves.detail(got))
        self.cancel_rest()
        raise Exit(0)

    def go_on(self, got: Optional[saves.Progress]) -> None:
        """A checkpointed stop: requeue this job, or let the next chunk go on, within the
        bound."""
        words = saves.progress_words(got if self.known else None)
        if self.job["requeue"]:
            if int(self.restarts) + 1 < int(self.job["max_chunks"]):
                self.say("checkpoint written ({}); requeueing job {}".format(
                    words, self.job_id))
                self.event(contract.EV_REQUEUED, saves.detail(got))
                self.requeuing = True
                slurm(["scontrol", "requeue", self.self_ref])
                raise Exit(0)
            self.say("bound of {} runs reached before the work was done ({})".format(
                self.job["max_chunks"], words))
            self.event(contract.EV_INCOMPLETE, saves.detail(got))
            raise Exit(0)
        if self.chunk >= self.last_chunk:
            self.say("bound of {} chunks reached before the work was done ({}): submit "
                     "again with a larger --max-chunks to continue".format(
                         self.job["max_chunks"], words))
            self.event(contract.EV_INCOMPLETE, saves.detail(got))
            raise Exit(0)
        if not self.extend():
            self.event(contract.EV_INCOMPLETE, saves.detail(got))
            raise Exit(0)
        if self.known:
            self.say("checkpointed stop ({}); the next chunk goes on from it".format(words))
        else:
            self.say("stopped after a save ({}); the next chunk starts: {}".format(
                words, self.resume_hint(nxt=True)))
        self.event(contract.EV_STOPPED, saves.detail(got))
        raise Exit(0)

    def after_step(self, code: int) -> None:
        self.step_status(code)
        if self.job["complete_on_success"] and not self.stop_sent:
            # a program that ends with 0 before it is asked to stop has done its work
            open(self.path(contract.COMPLETE_MARKER), "a").close()
        got = self.progress()
        self.known = got is not None
        self.end_if_done(got)
        self.saved_at(got)
        if self.killed and self.last_save is not None and self.kill_at is not None:
            self.say("the work since the program's last save is redone by the next chunk: "
                     "{}s (last save {}, stopped {})".format(
                         int(max(0, self.kill_at - self.last_save)),
                         time.strftime("%H:%M:%S", time.localtime(self.last_save)),
                         time.strftime("%H:%M:%S", time.localtime(self.kill_at))))
        with open(self.path(contract.SAVED_MARKER), "w") as f:
            f.write("{} {} {}\n".format(self.chunk, self.job_id, int(self.last_save or 0)))
        self.go_on(got)

    def cleanup(self) -> None:
        """The chunk's own files: its folder, the readiness and stop-request files, and a
        sweep task's empty log files that Slurm opened beside the sweep's logs."""
        if self.tmp:
            remove_tree(self.tmp)
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


class Exit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def remove_file(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def gpu_report() -> None:
    try:
        subprocess.call(["nvidia-smi"], stdout=sys.stderr)
    except OSError:
        log_line = "nvidia-smi not available on {}".format(socket.gethostname())
        sys.stderr.write("{} train-job: {}\n".format(time.strftime("%H:%M:%S"), log_line))


def engine_root() -> str:
    """The engine's folder (the run folder's copy): what `python3 ENGINE` runs."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_job(run_dir: str) -> Record:
    """The job record that submit wrote (chain.json's "job")."""
    path = os.path.join(run_dir, contract.CHAIN_RECORD)
    data = saves.read_small(path, 16 * 1024 * 1024)
    try:
        record = json.loads((data or b"").decode("utf-8"))
        job = record["job"]
    except (ValueError, KeyError, TypeError):
        raise Usage("{} holds no job record (written by `train submit`): submit the job "
                    "with `train submit`".format(path)) from None
    missing = [k for k in JOB_KEYS if k not in job]
    if missing:
        raise Usage("{}: the job record lacks {}: submit the job again with this client's "
                    "`train submit`".format(path, ", ".join(missing)))
    return dict(job)


JOB_KEYS = ("run_dir", "max_chunks", "walltime_seconds", "stop_signal", "stop_margin",
            "stop_mode", "requeue", "requeue_allowed", "complete_on_success", "stop_via",
            "step_grace", "step_ranks", "kill_grace", "runtime", "resume_args",
            "save_paths", "program_dir")


def parse_args(argv: Sequence[str]) -> Tuple[str, int, Optional[int], List[str]]:
    """SCRIPT [CHUNK [FIRST]] -- STEP...: the chunk number, the chain's first chunk."""
    if "--" not in argv:
        raise Usage("usage: ENGINE chunk SCRIPT [CHUNK [FIRST]] -- STEP...")
    cut = list(argv).index("--")
    head, step = list(argv[:cut]), list(argv[cut + 1:])
    if not head or not step or len(head) > 3:
        raise Usage("usage: ENGINE chunk SCRIPT [CHUNK [FIRST]] -- STEP...")
    words = head[1:] or ["1"]
    numbers = [saves._number(w) for w in words]
    if any(n is None or n == 0 for n in numbers):
        raise Usage("the chunk number (first argument) and the chain's first chunk (second, "
                    "optional) must be positive integers, got {}".format(
                        " ".join(repr(w) for w in words)))
    return head[0], int(words[0]), (int(words[1]) if len(words) > 1 else None), step


def main(argv: Sequence[str]) -> int:
    try:
        script, number, first, step = parse_args(argv)
        run_dir = os.path.dirname(engine_root())
        job = load_job(run_dir)
    except Usage as exc:
        sys.stderr.write("train-job: {}\n".format(exc))
        return EXIT_USAGE
    chunk = Chunk(job, script, number, first, step)
    handlers = {signal.SIGUSR1: lambda *_: chunk.usr1(),
                signal.SIGUSR2: lambda *_: None,
                signal.SIGTERM: lambda *_: chunk.on_term()}
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    try:
        chunk.array_task()
        chunk.prologue()
        chunk.start_step()
        chunk.extend()  # while the step starts up
        if chunk.terminating and not job["requeue_allowed"]:
            chunk.cancel_rest()  # the TERM came while the successor was being submitted
        code = chunk.wait_step()
        chunk.after_step(code)
        return 0
    except Exit as done:
        return done.code
    finally:
        chunk.cleanup()
