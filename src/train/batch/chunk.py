"""One chunk of a chain, on the batch host (`python3 ENGINE chunk SCRIPT [CHUNK [FIRST]]
-- STEP...` ends the job script): its start, its successor (submitted afterok on this one:
Slurm itself removes it when this one fails), and what its step's end means for the chain,
an event of train.batch.contract each (train.batch.step runs the step itself). Every
decision is unit-tested without Slurm (tests/unit/test_chain_engine*.py, stub Slurm).
"""

import os
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional, Sequence, Tuple

from train.batch import contract, saves
from train.batch.saves import (
    Usage,
    chunks_left,
    first_failure,
    load_job,
    overruns,
    parse_limit,
    read_text,
    signal_name,
    successors,
    time_used,
)
from train.batch.step import Exit, Step, engine_root, slurm

EXIT_USAGE = 2
GRACE_SECONDS = 15  # a TERM this close to the walltime is Slurm's time limit
NO_TASK_CODE = 1  # a step that started no task (srun said 0): the chunk failed
LIMIT_TRIES = 3  # squeue asked for the chunk's time limit (a floor's chain), 2 s apart


class Chunk(Step):
    """A chunk of the chain: its start, its successor, and what its step's end means."""

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
        lines = read_text(self.path(contract.CHAIN_IDS)).splitlines()
        if not any(line.split()[1:2] == [ref] for line in lines):
            return
        new = "".join("{} {}\n".format(line.split()[0], self.job_id)
                      if line.split()[1:2] == [ref] else line + "\n" for line in lines)
        tmp = ".{}.{}".format(contract.CHAIN_IDS, self.job_id)
        if self.write(tmp, new):
            os.replace(self.path(tmp), self.path(contract.CHAIN_IDS))

    def time_limit(self) -> Optional[int]:
        """A chain with a floor (--time-min) may start a chunk shorter than --time, where
        the scheduler has a hole: its real limit, from Slurm, is what the deadline, the
        overrun guard and the walltime's TERM are judged by (the stop signal Slurm times
        itself), and the chain's bound counts time: its chunks' limits up to max_chunks x
        --time, so a short chunk costs no extra chunk."""
        if not self.job.get("time_min_seconds"):
            return None
        # (self_ref: an array's last task has the array's id, which names every task)
        for attempt in range(LIMIT_TRIES):  # (a busy controller may time out once)
            if attempt:
                time.sleep(2)
            rc, out = slurm(["squeue", "--noheader", "--jobs=" + self.self_ref,
                             "--format=%l"])
            limit = parse_limit(out) if rc == 0 else None
            if limit is not None:
                break
        if limit is None:
            self.say("could not read this chunk's time limit (squeue: {}): taking the {}s "
                     "asked for".format(" ".join(out.split())[:200], self.asked))
            limit = self.asked
        self.job["walltime_seconds"] = limit
        # (the events' end: this chain's, where an earlier chain's fill the file)
        used = time_used(read_text(self.path(contract.CHAIN_EVENTS), tail=True),
                         self.first or 1, self.chunk, self.asked) + limit
        left = int(self.job["max_chunks"]) * self.asked - used
        self.last_chunk = self.chunk + chunks_left(int(self.job["max_chunks"]), self.asked,
                                                   used)
        if limit < self.asked:
            self.say("Slurm started this chunk early, in a hole of {}s of the {}s asked for "
                     "(--time-min): it stops at its stop signal before then, and the chain "
                     "has {}s of its bound left".format(limit, self.asked, max(0, left)))
        return limit

    def prologue(self) -> None:
        os.makedirs(self.path(contract.LOG_DIR), exist_ok=True)
        self.start = time.time()
        self.start_progress = self.progress()
        limit = self.time_limit()
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
        if limit is not None:
            self.event(contract.EV_LIMIT, "{} {}".format(limit, self.asked))

    def record_successor(self, next_chunk: int, job_id: str, how: str) -> None:
        self.write(contract.CHAIN_IDS, "{} {}\n".format(next_chunk, job_id), append=True)
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
            if os.path.isdir(os.path.join(self.tmp, "exits")):
                # before Slurm 26.05.2 a step aborted before it launched makes srun exit 0
                self.say("the step started no task (srun exited 0, yet no task of it ran): "
                         "the chunk failed; see srun's lines above")
                self.fail(NO_TASK_CODE, None, None)
            self.say("the tasks' records ({}) were removed while the step ran (by the "
                     "program?): srun's exit code 0 counts".format(self.tmp))
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
        try:
            subprocess.call(["nvidia-smi"], stdout=sys.stderr)
        except OSError:
            self.say("nvidia-smi not available on {}".format(socket.gethostname()))
        self.runtime_cleanup()
        raise self.end(contract.EV_FAILED, "{}{}".format(code, " " + node if node else ""),
                       code)

    def end(self, kind: str, detail: str, code: int = 0, cancel: bool = True) -> Exit:
        """The chunk's last event written, the chain's waiting chunks cancelled (`cancel`):
        the Exit (with `code`) to raise."""
        self.event(kind, detail)
        if cancel:
            self.cancel_rest()
        return Exit(code)

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
                         read_text(self.path(contract.CHAIN_EVENTS), tail=True)) + 1
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
        raise self.end(contract.EV_TIMEOUT, detail, 143)

    def end_if_done(self, got: Optional[saves.Progress]) -> None:
        """The chain ends here when the work is complete, or when this chunk added none."""
        marker = self.path(contract.COMPLETE_MARKER)
        if os.path.lexists(marker) and not saves.is_file(marker):
            self.say("{} is no regular file (a link, a folder or a FIFO): not taken as the "
                     "program's word that the work is complete".format(marker))
        elif os.path.lexists(marker):
            self.say("run complete")
            raise self.end(contract.EV_COMPLETE, saves.detail(got))
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
            raise self.end(contract.EV_NO_PROGRESS, saves.detail(got))

    def resume_hint(self, nxt: bool = False) -> str:
        if self.job.get("entry") == "train":
            return "`train run` goes on from its own checkpoint by itself"
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
            self.say("{} the next chunk can go on from: {}; the chain stops here".format(
                contract.UNSAVED_TEXT, why))
            raise self.end(contract.EV_UNSAVED, saves.detail(got))
        found = self.find_last_save()
        if self.overran and found is None:
            marker = read_text(self.path(contract.SAVED_MARKER), 256).split()
            self.last_save = float(marker[2]) if len(marker) > 2 and saves._number(
                marker[2]) is not None else time.time()
        elif got != self.start_progress:
            self.last_save = found or time.time()
        elif found is None:
            paths = " ".join(self.job["save_paths"])
            self.say("{}: the progress file, the run folder {}show nothing saved since this "
                     "chunk began; the chain stops here. Submit the same job again (with a "
                     "longer --time if the program saves too late for it): the chain goes on "
                     "at chunk {}".format(contract.UNSAVED_TEXT,
                                          "and " + paths + " " if paths else "", self.chunk + 1))
            raise self.end(contract.EV_UNSAVED, saves.detail(got))
        else:
            self.last_save = found

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
            raise self.end(contract.EV_INCOMPLETE, saves.detail(got), cancel=False)
        if self.chunk >= self.last_chunk:
            self.say("bound of {} chunks{} reached before the work was done ({}): submit "
                     "again with a larger --max-chunks to continue".format(
                         self.job["max_chunks"], " of --time (counted in time: chunks "
                         "started short by --time-min count their share)" if self.job.get(
                             "time_min_seconds") else "", words))
            raise self.end(contract.EV_INCOMPLETE, saves.detail(got), cancel=False)
        if not self.extend():
            raise self.end(contract.EV_INCOMPLETE, saves.detail(got), cancel=False)
        if self.known:
            self.say("checkpointed stop ({}); the next chunk goes on from it".format(words))
        else:
            self.say("stopped after a save ({}); the next chunk starts: {}".format(
                words, self.resume_hint(nxt=True)))
        raise self.end(contract.EV_STOPPED, saves.detail(got), cancel=False)

    def after_step(self, code: int) -> None:
        self.step_status(code)
        # a program that ends with 0 before it is asked to stop has done its work
        if self.job["complete_on_success"] and not self.stop_sent and not os.path.lexists(
                self.path(contract.COMPLETE_MARKER)):
            self.write(contract.COMPLETE_MARKER, "")
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
        self.write(contract.SAVED_MARKER, "{} {} {}\n".format(self.chunk, self.job_id,
                                                             int(self.last_save or 0)))
        self.go_on(got)


def parse_args(argv: Sequence[str]) -> Tuple[str, int, Optional[int], List[str]]:
    """SCRIPT [CHUNK [FIRST]] -- STEP...: the chunk number, the chain's first chunk."""
    cut = list(argv).index("--") if "--" in argv else len(argv)
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
    run_dir = os.path.dirname(engine_root())
    number = 0
    try:
        script, number, first, step = parse_args(argv)
        job = load_job(run_dir)
    except Usage as exc:
        sys.stderr.write("train-job: {}\n".format(exc))
        if number:  # a damaged job record: status says the chunk failed, its log says why
            saves.write_small(os.path.join(run_dir, contract.CHAIN_EVENTS), "{} {} {} {} {}\n"
                              .format(int(time.time()), number, os.environ.get(
                                  "SLURM_JOB_ID", "0"), contract.EV_FAILED, EXIT_USAGE),
                              append=True)
        return EXIT_USAGE
    chunk = Chunk(job, script, number, first, step)
    signal.signal(signal.SIGUSR1, lambda *_: chunk.usr1())
    signal.signal(signal.SIGUSR2, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: chunk.on_term())
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
        saves.deaf()  # (a program stops at its deadline as the walltime signal comes)
