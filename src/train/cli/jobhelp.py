"""`train render|submit --help`: one screen of what most jobs need; `--help TOPIC` one
argument group in full; `--help-all` every option (the parser's own full help), in the
groups of JOB_GROUPS."""

from __future__ import annotations

import argparse
import collections
import copy
import sys
from collections.abc import Sequence
from typing import Any

# the options most jobs need, each with a one-line summary (the full text: --help-all)
ESSENTIALS: tuple[tuple[str, str], ...] = (
    ("job_file", "job spec file: the flags' keys, with underscores"),
    ("cluster", "site profile: gilbreth, rivanna, torch, local, yours (train clusters)"),
    ("account", "SLURM account"),
    ("partition", "partition (Torch has none: -C h200 or -C l40s)"),
    ("constraint", "node constraint, e.g. h200|l40s on Torch"),
    ("nodes", "nodes (default: 1)"),
    ("gpus_per_node", "GPUs per node (default: 0)"),
    ("time", "walltime of one chunk, SLURM format (default: the profile's)"),
    ("runtime", "apptainer, docker or none (default: apptainer where --image is given, "
                "none where --python is)"),
    ("image", "container image (a SIF path or a docker tag) holding torch: a job on "
              "GPUs or of `train run` needs one, or --runtime none --python ENV/bin/python"),
    ("python", "the Python on the nodes (runtime none) or in the image"),
    ("entry", "train (`train run`, the default), command (your program) or navsim"),
    ("name", "job and run name: the run folder is runs/NAME (default: train)"),
    ("no_check", "skip the login node's checks and Slurm's sbatch --test-only"),
)
CHAIN_BASICS: tuple[tuple[str, str], ...] = (
    ("max_chunks", "at most N walltime-sized chunks (default: 10; 1 for a command)"),
    ("total_time", "the chain's total walltime: sets --max-chunks to total / --time"),
    ("stop_mode", "signal: the program checkpoints on the stop signal (default); kill: "
                  "it is ended, and resumes from its own last save"),
    ("resume_args", "added to the program's arguments after a checkpointed stop"),
    ("save_path", "where the program saves (a stop counts only when it changed)"),
)
# render and submit: the job's flags by topic (`--help TOPIC` -> the group's title, what it
# is about, its fields), so the help reads as a few short lists; a field not named here
# lands in "other" (a unit test refuses that)
JOB_GROUPS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "job": ("job", "what runs, and where its files go",
            ("name", "cluster", "entry", "out", "sweep_seeds", "sweep", "sweep_throttle",
             "no_check")),
    "resources": ("resources", "what the job asks SLURM for, per node",
                  ("account", "partition", "qos", "constraint", "time", "nodes",
                   "gpus_per_node", "gpu_type", "cpus_per_task", "mem", "ntasks_per_node",
                   "workers", "worker_mem", "preempt")),
    "chain": ("chain", "walltime-sized chunks that checkpoint and resume",
              ("max_chunks", "total_time", "time_min", "requeue", "stop_signal", "signal_margin",
               "time_budget", "stop_mode", "resume_args", "save_path")),
    "container": ("container", "the runtime, the image, and what the program sees of the host",
                  ("runtime", "image", "python", "bind", "env")),
    "program": ("program", "how the program is started on the nodes",
                ("launch", "chdir", "data", "navsim_split", "navsim_script",
                 "navsim_strategy")),
    "gpu-wait": ("GPU memory wait", "before the program starts, on shared GPUs",
                 ("min_free_mb", "wait_timeout", "fallback_batch")),
    "monitoring": ("monitoring", "GPU utilisation watch while the job runs",
                   ("gpu_watch_interval", "gpu_idle_threshold", "gpu_idle_minutes")),
    "slurm": ("passed to SLURM", "options this tool has no flag for",
              ("sbatch_extra", "srun_extra")),
}


def job_groups(p: argparse.ArgumentParser) -> dict[str, Any]:
    """The render/submit parser's argument groups, by field name ("other" for the rest)."""
    by_field: dict[str, Any] = {}
    for title, text, names in JOB_GROUPS.values():
        group = p.add_argument_group(f"{title} ({text})")
        by_field.update(dict.fromkeys(names, group))
    other = p.add_argument_group("other")
    return collections.defaultdict(lambda: other, by_field)


class _HelpAction(argparse._HelpAction):
    """`-h, --help [TOPIC]`: the one-screen help, or one topic's options in full."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        argparse.Action.__init__(self, option_strings, dest=dest, default=default,
                                 nargs="?", metavar="TOPIC", help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if values is None:
            text = short_help(parser)
        elif values == "all":
            text = parser.format_help()
        elif values in JOB_GROUPS:
            text = topic_help(parser, JOB_GROUPS[values][0])
        else:
            parser.error(f"--help: no topic {values!r}; the topics: "
                         f"{', '.join(JOB_GROUPS)} (or all)")
        sys.stdout.write(text)
        parser.exit()


def add_help(p: argparse.ArgumentParser) -> None:
    """The job command's help options (its parser is made with add_help=False)."""
    p.add_argument("-h", "--help", action=_HelpAction,
                   help=f"this screen; --help TOPIC: one topic in full ({', '.join(JOB_GROUPS)})")
    p.add_argument("--help-all", action="help", help="every option, by topic")


def full_epilog(p: argparse.ArgumentParser) -> str:
    """What --help-all adds below the groups: the on/off options' --no- forms, which argparse
    does not list (each turns its option off where a default or job file set it)."""
    offs = [s for a in p._actions if a.help == argparse.SUPPRESS
            for s in a.option_strings if s.startswith("--no-")]
    return (f"Each on/off option also has an off form: {', '.join(offs)}.\n"
            if offs else "")


def _section(formatter: argparse.HelpFormatter, title: str, actions: dict[str, Any],
             rows: Sequence[tuple[str, str]]) -> None:
    formatter.start_section(title)
    for dest, summary in rows:
        short = copy.copy(actions[dest])
        short.help = summary
        formatter.add_argument(short)
    formatter.end_section()


def short_help(p: argparse.ArgumentParser) -> str:
    """One screen: what most jobs need, the chain basics, then where the rest is."""
    actions = {a.dest: a for a in p._actions}
    formatter = p._get_formatter()
    formatter.add_usage(p.usage, p._actions, p._mutually_exclusive_groups)
    formatter.add_text(p.description)
    _section(formatter, "what most jobs need (defaults: `train init`)", actions, ESSENTIALS)
    _section(formatter, "the chain (walltime-sized chunks that checkpoint and resume)",
             actions, CHAIN_BASICS)
    shown = {dest for dest, _ in (*ESSENTIALS, *CHAIN_BASICS)}
    left = [a for a in p._actions if a.option_strings and a.dest not in shown
            and a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
    prog = p.prog
    topics = "\n".join(f"  {prog} --help {name:<12}{text}"
                       for name, (_, text, _) in JOB_GROUPS.items())
    formatter.add_text(f"{len(left)} more options, by topic ({prog} --help-all: all of "
                       f"them):\n{topics}")
    formatter.add_text("The workload and its arguments follow `--`, as `train run` takes "
                       f"them:\n  {prog} -M gilbreth -A ACCT -g 1 -t 2:00:00 -- demo "
                       f"--episodes 9000\n  {prog} -N 2 -g 4 -t 12:00:00 -- "
                       "python train.py\nBad input exits 2 and nothing is submitted.")
    return formatter.format_help()


def _group(p: argparse.ArgumentParser, title: str) -> Any:
    return next(g for g in p._action_groups if (g.title or "").partition(" (")[0] == title)


def topic_help(p: argparse.ArgumentParser, title: str) -> str:
    """One argument group with every option's full help."""
    group = _group(p, title)
    formatter = p._get_formatter()
    formatter.add_usage(p.usage, p._actions, p._mutually_exclusive_groups)
    formatter.start_section(group.title)
    formatter.add_arguments(group._group_actions)
    formatter.end_section()
    return formatter.format_help()
