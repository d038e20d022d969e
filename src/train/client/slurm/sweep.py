"""Sweeps: one chain per task (a seed of --sweep-seeds, a value of --sweep), submitted
together as one job array (sweeparray). runs/NAME holds the sweep's record (`sweep.json`)
and one ordinary chain folder per task (`seed-4/`, `task-0/`, ...).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import Any, TypeGuard

from train.batch.contract import SWEEP_RECORD
from train.batch.saves import read_small
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.resolve import ResolvedJob
from train.client.slurm.sweepargs import (
    check_command_sweep,
    check_unmarked,
    placed,
    task_changes,
)
from train.common.errors import ConfigError, UsageError
from train.common.jsonio import write_json_atomic
from train.workloads.config import MAX_SEED, RunConfig, run_config_from_argv

# Slurm's default MaxArraySize (its array indices run from 0 to MaxArraySize - 1)
DEFAULT_MAX_ARRAY_SIZE = 1001
# what each task of a command's sweep finds in its environment
SWEEP_INDEX_VAR = "TRAIN_SWEEP_INDEX"
SWEEP_VALUE_VAR = "TRAIN_SWEEP_VALUE"


def seed_dir(seed: int) -> str:
    return f"seed-{seed}"


@dataclasses.dataclass(frozen=True)
class SweepTask:
    """One task of a sweep: its index in the job array, the value it runs with, the seed
    its `train run` trains (None for a command), and its folder under the sweep's."""

    index: int
    value: str
    seed: int | None
    dir: str

    @property
    def label(self) -> str:
        return str(self.seed) if self.dir == seed_dir(self.seed or 0) else self.value


def _values(spec: JobSpec) -> tuple[str, list[str]]:
    """The swept flag's name (`seeds` for --sweep-seeds) and its values, checked."""
    if spec.sweep and spec.sweep_seeds:
        raise ConfigError("sweep", "give --sweep or --sweep-seeds, not both")
    if spec.sweep_seeds:
        if len(spec.sweep_seeds) != len(set(spec.sweep_seeds)) or \
                any(s < 0 or s > MAX_SEED for s in spec.sweep_seeds):
            raise ConfigError("sweep_seeds", f"must be distinct integers from 0 to {MAX_SEED}, "
                              f"got {list(spec.sweep_seeds)}")
        return "seeds", [str(s) for s in spec.sweep_seeds]
    name, sep, text = (spec.sweep or "").partition("=")
    name = name.strip().lstrip("-")
    values = [v.strip() for v in text.split(",")]
    # a `train run` flag is spelled as argparse takes it; a command's NAME only labels
    # the sweep (its record, `train status`, `train summary`): kept as written
    if spec.entry == "train":
        name, rule = name.replace("_", "-"), r"[a-z][a-z0-9-]{0,40}"
    else:
        rule = r"[A-Za-z_][A-Za-z0-9_.-]{0,40}"
    if not sep or not re.fullmatch(rule, name) or not all(values) or \
            any(c in text for c in "\n\r\0"):
        raise ConfigError("sweep", "must be NAME=V1,V2,... (spaces around NAME and each "
                          "value are dropped): for `train run` one of its flags without "
                          "the dashes, e.g. lr=1e-3,5e-4; for a command a name of letters, "
                          "digits, '_', '.' and '-' (at most 41, not starting with a digit, "
                          f"'.' or '-'), e.g. optimizer.lr=1e-3,5e-4; got {spec.sweep!r}")
    if values[0].startswith("[") and values[-1].endswith("]"):
        raise ConfigError("sweep", f"{spec.sweep!r}: the values are split at ',' and taken "
                          f"as written, brackets too: write {name}={text.strip()[1:-1]}")
    odd = next((v for v in values if not v.isprintable()), None)
    if odd is not None:  # a terminal escape or tab: into the script, the logs, status
        raise ConfigError("sweep", f"value {odd!r} holds a control character; values are "
                          "printable text")
    if name == "seeds":
        raise ConfigError("sweep", "sweep seeds with --sweep-seeds \"4 6 8\"")
    seen: dict[object, str] = {}
    for value in values:
        key = value_key(spec.entry, name, value)
        if key in seen:
            same = "are the same value" if seen[key] != value else "are given twice"
            of = f"--{name}" if spec.entry == "train" else name  # (a command's: a label)
            raise ConfigError("sweep", f"the values must differ: {seen[key]!r} and {value!r} "
                              f"{same} of {of}")
        seen[key] = value
    return name, values


def value_key(entry: str, flag: str, value: str) -> object:
    """What a swept value is as its flag reads it: a number for a `train run` flag that
    takes one (1e-3 and 0.001 are one value), the text itself otherwise (a command sees
    the text)."""
    kind = next((f.metadata["kind"] for f in dataclasses.fields(RunConfig)
                 if f.name == flag.replace("-", "_")), str) if entry == "train" else str
    if kind not in (int, float):
        return value
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def swept_flag(spec: JobSpec) -> str:
    """The flag the sweep sets per task (`seeds` for --sweep-seeds)."""
    return _values(spec)[0]


def requeue_mode(spec: JobSpec) -> bool:
    """Whether the sweep's tasks run in requeue mode: asked for (--requeue), or a throttled
    sweep. Slurm counts a requeued array task against the array's throttle again, never a
    task's successors (jobs of their own, outside the array): only when each task requeues
    itself after a checkpointed stop does --sweep-throttle bound every chunk of every task.
    Unthrottled sweeps chain each task with successor jobs, as single chains do."""
    return spec.requeue or spec.sweep_throttle is not None


def split(spec: JobSpec, max_array_size: int = DEFAULT_MAX_ARRAY_SIZE
          ) -> tuple[Path, list[tuple[SweepTask, JobSpec]]]:
    """The sweep's root directory and one chain spec per task of its job array."""
    field = "sweep" if spec.sweep else "sweep_seeds"
    if spec.entry == "navsim":
        raise ConfigError(field, "sweeps are for `train run` workloads and commands (entry "
                          "train or command)")
    flag, values = _values(spec)
    if len(values) > max_array_size:
        raise ConfigError(field, f"{len(values)} tasks are more than the cluster's job "
                          f"array size limit of {max_array_size} (max_array_size in its "
                          "profile; Slurm's MaxArraySize): split the sweep")
    if spec.sweep_throttle is not None and spec.sweep_throttle > len(values):
        raise ConfigError("sweep_throttle", f"must be 1 to {len(values)} (the sweep's "
                          f"tasks), got {spec.sweep_throttle}: a larger one throttles nothing")
    given = f"--{flag}"
    if spec.entry == "train" and any(a == given or a.startswith(given + "=")
                                     for a in spec.workload):
        raise ConfigError(field, f"give the {flag} once: the sweep sets {given} for each "
                          f"task (remove {given} from the workload)")
    if spec.entry == "command":
        check_command_sweep(spec)
    check_unmarked(spec, chdir_placed=spec.entry == "command")
    root = Path(os.path.abspath(spec.out or os.path.join("runs", spec.name)))
    folders = bound_folders(root, spec.entry, flag, values) if flag != "seeds" else {}
    out = []
    for index, value in enumerate(values):
        seed = int(value) if flag == "seeds" else None
        where = seed_dir(seed) if seed is not None else folders[value]
        suffix = f"-s{seed}" if seed is not None else f"-t{index}"  # the names must differ
        changes: dict[str, Any] = {"name": spec.name[:64 - len(suffix)] + suffix,
                                   "out": str(root / where), "sweep_seeds": (), "sweep": None,
                                   "requeue": requeue_mode(spec)}
        if spec.entry == "train":  # (no marker is replaced: the sweep sets the flag)
            changes.update(placed(spec.workload, spec.resume_args, spec.save_path))
            changes["workload"] = (*changes["workload"], given, value)
            if seed is None:
                seed = _train_seed(spec.workload)
        else:  # a command: its {value}, {index} and {task_dir} (train.client.slurm.sweepargs)
            changes.update(task_changes(spec, index, value, str(root / where)))
        out.append((SweepTask(index, value, seed, where), dataclasses.replace(spec, **changes)))
    return root, out


def task_job(task: SweepTask, job: ResolvedJob) -> ResolvedJob:
    """The task's resolved job: every process of its chain (each chunk) finds its index
    and value in TRAIN_SWEEP_INDEX and TRAIN_SWEEP_VALUE (names a job may not set)."""
    values = (*job.env_values, (SWEEP_INDEX_VAR, str(task.index)),
              (SWEEP_VALUE_VAR, task.value))
    return dataclasses.replace(job, env_values=values)


def is_task_job(job: ResolvedJob) -> bool:
    """Whether the job is a task of a sweep (task_job made it)."""
    return any(name == SWEEP_INDEX_VAR for name, _ in job.env_values)


def _train_seed(workload: tuple[str, ...]) -> int | None:
    """The first seed a `train run` workload trains (where its flags can be read)."""
    try:
        seeds = run_config_from_argv(list(workload)).seeds
    except (ConfigError, UsageError, SystemExit):
        return None
    return seeds[0] if seeds else None


def bound_folders(root: Path, entry: str, flag: str, values: list[str]) -> dict[str, str]:
    """Each value's task folder. A value sweep's folder is bound to its value for good (the
    record's `folders`): submitted again, in any order, each value goes on in its own
    folder (with its checkpoint); a new value gets a task-K folder no value ever had."""
    folders: dict[str, str] = {}
    if (root / SWEEP_RECORD).is_file():
        record = load_record(root)
        kept = record.get("flag")  # (a command's NAME was once kept with '-' for '_')
        if isinstance(kept, str) and kept != "seeds" and \
                kept.replace("_", "-") != flag.replace("_", "-"):
            raise ConfigError("sweep", f"{root} is a sweep of --{record.get('flag')}; this "
                              f"one is of --{flag}: choose another --name (or --out)")
        folders = recorded_folders(record)
    by_key = {value_key(entry, flag, v): d for d, v in folders.items()}
    used = set(folders)
    with contextlib.suppress(OSError):
        used |= {p.name for p in root.iterdir()} if root.is_dir() else set()
    out: dict[str, str] = {}
    for value in values:
        where = by_key.get(value_key(entry, flag, value))
        if where is None:
            where = next(f"task-{k}" for k in range(len(used) + len(values) + 1)
                         if f"task-{k}" not in used)
            used.add(where)
        out[value] = where
    return out


def recorded_folders(record: dict[str, Any]) -> dict[str, str]:
    """{task folder: the value it is bound to} of a sweep's record: its `folders`, and
    its chains' (a record of before `folders`); entries that are not text are skipped."""
    found: dict[str, str] = {}
    kept = record.get("folders")
    for where, value in (kept.items() if isinstance(kept, dict) else ()):
        if isinstance(where, str) and isinstance(value, str) and _TASK_DIR.fullmatch(where):
            found[where] = value
    for chain in record.get("chains") or ():
        if isinstance(chain, dict) and isinstance(chain.get("dir"), str) and \
                isinstance(chain.get("value"), str) and chain["dir"].startswith("task-"):
            found.setdefault(chain["dir"], chain["value"])
    return found


def write_record(root: Path, name: str, tasks: list[SweepTask], flag: str = "seeds",
                 **extra: Any) -> None:
    """sweep.json: the sweep's tasks, and (a value sweep) every folder's value so far."""
    chains = [{"index": t.index, "value": t.value, "seed": t.seed, "dir": t.dir}
              for t in tasks]
    folders: dict[str, str] = {}
    if flag != "seeds":
        if (root / SWEEP_RECORD).is_file():
            with contextlib.suppress(UsageError):
                folders = recorded_folders(load_record(root))
        folders.update({t.dir: t.value for t in tasks})
        extra["folders"] = folders
    write_json_atomic(root / SWEEP_RECORD, {"name": name, "flag": flag, **extra,
                                            "chains": chains})


RECORD_LIMIT = 4 << 20  # sweep.json: about 100 bytes a task, at most a few thousand tasks


def read_json(path: Path, limit: int) -> Any:
    """A JSON file's value; None where it is missing or not a regular file; ValueError for
    one that is not JSON (nor UTF-8) or over `limit` bytes."""
    data = read_small(str(path), limit + 1)
    if data is None:
        return None
    if len(data) > limit:
        raise ValueError(f"over {limit} bytes")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


def load_record(root: Path) -> dict[str, Any]:
    path = root / SWEEP_RECORD
    try:
        record = read_json(path, RECORD_LIMIT)
    except ValueError as exc:
        raise UsageError(f"sweep: cannot read {path}: {str(exc)[:120]}") from None
    if record is None:
        raise UsageError(f"sweep: cannot read {path}: missing or not a regular file")
    if not isinstance(record, dict) or not isinstance(record.get("chains"), list):
        raise UsageError(f"sweep: {path} does not hold a sweep record (an object with a "
                         "list of chains)")
    return record


def record_flag(record: dict[str, Any]) -> str:
    """The swept flag a record names ("seeds" where a damaged record names none)."""
    flag = record.get("flag")
    return flag[:64] if isinstance(flag, str) and flag else "seeds"


def is_sweep(path: Path) -> bool:
    return (path / SWEEP_RECORD).is_file()


_TASK_DIR = re.compile(r"(seed|task)-[0-9]{1,18}")


def whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31


def _task(i: int, chain: Any) -> SweepTask | str:
    """Entry i of the record's chains as a task, or what is wrong with it."""
    if not isinstance(chain, dict):
        return f"is not an object ({type(chain).__name__})"
    seed, where, index = chain.get("seed"), chain.get("dir"), chain.get("index", i)
    if seed is not None and not whole(seed):
        return f"its seed {repr(seed)[:40]} is not a whole number"
    if where is None and seed is not None:  # a record of before the job arrays
        where = seed_dir(seed)
    if not isinstance(where, str) or not _TASK_DIR.fullmatch(where):
        return f"its dir {repr(where)[:40]} is not a task folder (seed-N or task-N)"
    if not whole(index):
        return f"its index {repr(index)[:40]} is not a whole number"
    value = chain.get("value", seed)
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        return f"its value {repr(value)[:40]} is not text"
    if isinstance(value, str) and not value.isprintable():
        return f"its value {repr(value)[:40]} holds control characters (never a sweep's)"
    return SweepTask(index, str(value), seed, where)


def read_tasks(root: Path, record: dict[str, Any] | None = None
               ) -> tuple[list[SweepTask], list[str]]:
    """The sweep's tasks from its record (`record`: already read), a moved sweep's where it
    is now, and a line naming each entry that is not a task (the rest are still read)."""
    tasks, bad = [], []
    for i, chain in enumerate((load_record(root) if record is None else record)["chains"]):
        found = _task(i, chain)
        if isinstance(found, str):
            bad.append(f"{root / SWEEP_RECORD}: chain {i + 1}: {found}")
        else:
            tasks.append(found)
    return tasks, bad


def not_a_chain(field: str, ref: str, root: Path) -> UsageError:
    """The error for a command that reads one chain, given a whole sweep: its chains."""
    return UsageError(f"{field}: {ref} is a sweep; name one of its chains: "
                      + ", ".join(f"{ref}/{t.dir}" for t in read_tasks(root)[0]))


def aggregate(name: str, root: Path, statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's own state from its chains' (the worst first)."""
    states = [s.get("state", "unknown") for s in statuses]
    order = ("failed", "unreadable", "cancelled", "stalled", "incomplete", "ended", "held",
             "running", "pending", "complete")
    state = next((s for s in order if s in states), states[0] if states else "empty")
    done = sum(int(s.get("done") or 0) for s in statuses)
    total = sum(int(s.get("total") or 0) for s in statuses)
    return {"name": name, "run_dir": str(root), "sweep": True, "state": state,
            "done": done, "total": total,
            "counts": {s: states.count(s) for s in dict.fromkeys(states)},
            "chains": statuses}
