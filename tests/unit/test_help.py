"""`train --help` and the job commands' help: options in named groups, one default each,
and a top line for users."""

from __future__ import annotations

import argparse
import re

import pytest

from tests.conftest import run_cli
from train.cli import build_parser


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions
            if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("command", sorted(_commands()))
def test_no_option_states_two_defaults(command: str) -> None:
    p = _commands()[command]
    for action in _options(p):
        text = (action.help or "") % {"default": action.default, "prog": p.prog}
        # "(default: 4)", "(default none: ...)", "Default: 10": statements of the default,
        # not the word as a value ("`default` for a real build")
        stated = re.findall(r"\(default\b|\bdefault:", text, re.IGNORECASE)
        assert len(stated) <= 1, f"{command} {action.option_strings[-1]}: {text}"
    # and as printed: no option block says "(default: None)" or a second default
    assert "(default: None)" not in p.format_help()
    assert "(default: False)" not in p.format_help()


@pytest.mark.parametrize("command", ["render", "submit"])
def test_every_job_option_is_in_a_named_group(command: str) -> None:
    p = _commands()[command]
    homes = {id(a): g.title for g in p._action_groups for a in g._group_actions}
    ungrouped = [a.option_strings[-1] for a in _options(p)
                 if homes[id(a)] in ("options", "optional arguments", "other")]
    assert not ungrouped, f"options outside a named group: {ungrouped}"
    text = p.format_help()
    for title in ("resources", "chain", "container", "program", "monitoring"):
        assert re.search(rf"^{title} \(.*\):$", text, re.MULTILINE), title
    # the value is named once: `-g, --gpus-per-node N`, not `-g N, --gpus-per-node N`
    assert "-g, --gpus-per-node N " in text and "-g GPUS_PER_NODE" not in text


def test_the_top_level_help_is_for_users() -> None:
    text = build_parser().format_help()
    description = text.split("\n\n")[1]
    assert description.startswith("Train on a university SLURM cluster")
    assert "exceptions" not in text and "exit codes" not in description
    for command in ("init", "submit", "status", "run demo"):
        assert command in description


def test_options_on_the_wrong_side_of_the_double_dash_say_where_they_go() -> None:
    """Two everyday slips: the workload's options before `--` (the `--` forgotten), and the
    job's options after it."""
    forgot = run_cli(["render", "-M", "local", "-g", "1", "--runtime", "none", "sc2",
                      "--episodes", "10"])
    assert forgot.returncode == 2
    assert "a workload and its own options go after `--`" in forgot.stderr
    after = run_cli(["render", "-M", "local", "--runtime", "none", "--", "demo",
                     "--episodes", "10", "-g", "1", "-t", "30"])
    assert after.returncode == 2
    assert "those of train render/submit go before `--`" in after.stderr


ESSENTIAL_FLAGS = ("--cluster", "--nodes", "--gpus-per-node", "--time", "--image",
                   "--runtime", "--entry", "--name", "--max-chunks", "--total-time",
                   "--resume-args", "--help-all")


@pytest.mark.parametrize("command", ["render", "submit"])
def test_the_job_help_fits_a_screen_and_says_where_the_rest_is(command: str) -> None:
    proc = run_cli([command, "--help"], env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= 60, len(lines)
    for flag in ESSENTIAL_FLAGS:
        assert flag in proc.stdout, flag
    for topic in ("job", "resources", "chain", "container", "program", "gpu-wait",
                  "monitoring", "slurm"):
        assert f"train {command} --help {topic} " in proc.stdout, topic
    assert "--sbatch-extra" not in proc.stdout  # a topic's, not the first screen's
    # issue 39: a 1-GPU job without an image died after the queue; the first screen says
    # what a job needs
    flat = " ".join(proc.stdout.split())
    assert "a job on GPUs or of `train run` needs one, or --runtime none --python" in flat


def _option_strings(command: str) -> list[str]:
    return [s for a in _commands()[command]._actions for s in a.option_strings]


@pytest.mark.parametrize("command", ["render", "submit"])
def test_help_all_names_every_option(command: str) -> None:
    proc = run_cli([command, "--help-all"], env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    named = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", proc.stdout))
    missing = [s for s in _option_strings(command) if s not in named]
    assert not missing, missing
    assert len(_option_strings(command)) > 55  # the whole parser, not a part of it


@pytest.mark.parametrize("command", ["render", "submit"])
def test_every_job_option_still_parses(command: str) -> None:
    parser = build_parser()
    for action in _commands()[command]._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        for flag in action.option_strings:
            argv = [command, flag] if action.nargs == 0 else [command, flag, "1"]
            args = parser.parse_args(argv)
            assert getattr(args, action.dest) not in (None, []), (flag, args)


def test_help_topic_shows_one_group_in_full_and_an_unknown_topic_is_named() -> None:
    proc = run_cli(["submit", "--help", "slurm"], env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert "--sbatch-extra" in proc.stdout and "--srun-extra" in proc.stdout
    assert "--gpus-per-node" not in proc.stdout
    bad = run_cli(["submit", "--help", "gpus"])
    assert bad.returncode == 2 and not bad.stdout
    assert "--help: no topic 'gpus'" in bad.stderr and "resources" in bad.stderr
    assert "Traceback" not in bad.stderr
